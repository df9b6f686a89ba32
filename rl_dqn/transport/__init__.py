"""The only code that touches torch.distributed.rpc.

The roles see two small endpoints, typed in endpoints.py: `LearnerEndpoint` (receive() chunks, acknowledge() them,
publish() weights, who is alive, lost and has changed, stop_collectors()) and `CollectorEndpoint` (send() a chunk,
wait_weights() / poll_weights(), stop_requested). `LearnerTransport` and `CollectorTransport` are them over RPC;
`transport.kind` and the devices in `place()` decide where their tensors travel, and the roles do not change with
them.
"""

from rl_dqn.transport.devices import (LEARNER_RANK, Placement, collector_rank, eval_device, place, slot_of,
                                      worker_name)
from rl_dqn.transport.endpoints import (Change, CollectorEndpoint, Delivery, LearnerEndpoint, Membership,
                                        Standing)
from rl_dqn.transport.rpc import CollectorTransport, LearnerTransport, TransportError

__all__ = ["LEARNER_RANK", "Change", "CollectorEndpoint", "CollectorTransport", "Delivery", "LearnerEndpoint",
           "LearnerTransport", "Membership", "Placement", "Standing", "TransportError", "collector_rank", "eval_device",
           "place", "slot_of", "worker_name"]
