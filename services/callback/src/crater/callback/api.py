"""What the callback offers outside its service (`crater webhooks`): its delivery log. The
reference receiver is `crater.callback.sim.receiver`."""

from crater.callback.adapters.store import DeliveryLog

__all__ = ["DeliveryLog"]
