"""Where gangs run: the backend protocol and its local implementation."""

from tideflow.backends.protocol import Backend, GangJob, GangState, GangStatus, WorkerSlot

__all__ = ["Backend", "GangJob", "GangState", "GangStatus", "WorkerSlot"]
