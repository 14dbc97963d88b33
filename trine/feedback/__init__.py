"""Human feedback: the annotation queue (:mod:`.queue`), landing answers in a buffer (:mod:`.landing`)
and Label Studio's JSON format (:mod:`.labelstudio`).

A base module: it imports only :mod:`trine.types` and SQLAlchemy, so a workflow may post items and the
studio, the CLI and the wiring may read and land them.
"""

from trine.feedback.queue import (
    ANNOTATIONS_FILE,
    AnnotationQueue,
    AnswerConflict,
    Item,
    queue_url,
)

__all__ = ["ANNOTATIONS_FILE", "AnnotationQueue", "AnswerConflict", "Item", "queue_url"]
