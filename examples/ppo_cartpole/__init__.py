"""rlinfra's main job: PPO on CartPole with actor, rollout and env placed by YAML (see job.py)."""
