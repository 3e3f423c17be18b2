"""Views of a plan: the tables, the node × device map, the layout and the node loads that
``rlinfra plan`` prints for a described cluster and ``rlinfra.driver.Run`` prints for the live one
before any worker starts. Below both (it reads placement and runtime records, renders with rich),
so the driver never reaches up into the CLI."""
