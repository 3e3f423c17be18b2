"""Services on top of the runtime: naming (a KV with TTLs and leases), weights (the version
barrier), jobs and Slurm; each is imported from its own module (``rlinfra.services.naming`` …),
one door per name."""
