"""Observations to fit: `Data` (times and values of states or observables), and event
tables in the NONMEM / nlmixr2 convention read into problems and data (`read_events`)."""

from .events import Subject, read_events
from .observations import Data

__all__ = ["Data", "Subject", "read_events"]
