"""Node composition: boot, StageController, and `worker_ctl.GpuWorkerCtl` (spec §8, §14, §28)."""
