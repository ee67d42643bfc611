"""The Job layer: what a training job is to the workbook, and the built-in PPO job (see docs/architecture.md)."""
