"""Tasks: tasksets loaded from local data, the task scheduler, and built-in task generators."""

from trine.tasks.arithmetic import generate_arithmetic, write_jsonl
from trine.tasks.scheduler import TaskScheduler
from trine.tasks.taskset import TaskSet

__all__ = ["TaskSet", "TaskScheduler", "generate_arithmetic", "write_jsonl"]
