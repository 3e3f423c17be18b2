"""Operations: a run's life outside the driver — Ray job submission and lifecycle (``jobs``) and
Slurm batch scripts that start Ray on an allocation (``slurm``)."""
