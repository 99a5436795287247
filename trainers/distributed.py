"""Deprecated: ``trainers.distributed`` is now ``trainers.parallel`` (issue 34); it goes in the next
release."""

from nets.deprecation import moved_module

moved_module(__name__, "trainers.parallel")
