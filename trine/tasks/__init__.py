"""Tasks: tasksets loaded from local data, task schedulers (selectors, weighted mixes, an online
curriculum), and built-in task generators."""

from trine.tasks.arithmetic import generate_arithmetic, write_jsonl
from trine.tasks.curriculum import CurriculumScheduler
from trine.tasks.factory import SCHEDULERS, build_scheduler
from trine.tasks.mixed import MixedScheduler
from trine.tasks.scheduler import TaskScheduler
from trine.tasks.selectors import SELECTORS
from trine.tasks.taskset import TaskSet

__all__ = [
    "SCHEDULERS",
    "SELECTORS",
    "CurriculumScheduler",
    "MixedScheduler",
    "TaskScheduler",
    "TaskSet",
    "build_scheduler",
    "generate_arithmetic",
    "write_jsonl",
]
