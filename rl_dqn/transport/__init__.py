"""The only code that touches torch.distributed.rpc.

The roles see two small endpoints:
- `LearnerTransport`: receive() chunks, acknowledge() them, publish() weights, stop_collectors(), close();
- `CollectorTransport`: send() a chunk, poll_weights() / wait_weights(), stop_requested, close().
`transport.kind` and the devices in `place()` decide where their tensors travel; the roles do not change with them.
"""

from rl_dqn.transport.devices import LEARNER_RANK, Placement, place, slot_of, worker_name
from rl_dqn.transport.rpc import (CollectorTransport, Delivery, LearnerTransport, Standing, TransportError,
                                  collector_rank)

__all__ = ["LEARNER_RANK", "CollectorTransport", "Delivery", "LearnerTransport", "Placement", "Standing",
           "TransportError", "collector_rank", "place", "slot_of", "worker_name"]
