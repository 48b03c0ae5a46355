"""Links to Redis behind one small interface; the layers above never look behind it.

* :meth:`Transport.send` writes one encoded command on the link that serves ``key`` (opening
  one if needed, bounded by a deadline) and returns its :class:`Call`, whose future gets the
  reply, an :class:`ErrorReply`, or :class:`OutcomeUnknown` when the link was dropped.
* :meth:`Transport.fence` makes sure that a dropped link's requests can never run any more
  (``CLIENT KILL ID`` from another link), so the caller may read what happened and conclude;
  without a fence nothing may be concluded "did not run".
* :meth:`Transport.subscribe` / :meth:`Transport.unsubscribe`: pub/sub channels whose messages
  go to a :class:`Listener`, one per channel.
* :meth:`Transport.watch` registers a :class:`Watcher`, told when a server behind the
  links changes (a failover, a restart: another ``run_id``, a cluster slot migrated), so that
  holds are re-checked; :meth:`Transport.epoch_of` says which keys a change concerns, and
  ``Call.epoch`` in which epoch a reply's command was sent.
* :meth:`Transport.aclose` closes every link.

:class:`StandaloneTransport` serves one server; a cluster transport serves one link per node
behind the same interface, routing by ``key``.
"""

from .base import Transport as Transport
from .base import TransportStatistics as TransportStatistics
from .base import Watcher as Watcher
from .base import wait_call as wait_call
from .calls import Call as Call
from .calls import Chain as Chain
from .calls import ErrorReply as ErrorReply
from .calls import LinkIdentity as LinkIdentity
from .calls import NotSent as NotSent
from .calls import OutcomeUnknown as OutcomeUnknown
from .calls import first_reply as first_reply
from .calls import is_readonly as is_readonly
from .calls import pack as pack
from .calls import register_script as register_script
from .link import Link as Link
from .settings import ServerSettings as ServerSettings
from .standalone import StandaloneTransport as StandaloneTransport
from .subscriber import Listener as Listener
from .subscriber import SubscribeRefused as SubscribeRefused
