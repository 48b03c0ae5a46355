"""aiolock: asyncio-native distributed locks and synchronizers on Redis."""

from .client import AioLock as AioLock
from .client import from_url as from_url
from .config import Config as Config
from .default import alock as alock
from .default import configure as configure
from .errors import AioLockError as AioLockError
from .errors import ClientClosedError as ClientClosedError
from .errors import LockError as LockError
from .errors import LockLostError as LockLostError
from .errors import LockNotOwnedError as LockNotOwnedError
from .errors import LockTimeout as LockTimeout
from .errors import RedisOperationError as RedisOperationError
from .errors import WrongEventLoopError as WrongEventLoopError
from .fenced_lock import FencedLock as FencedLock
from .lock import Lock as Lock

__all__ = [
    "AioLock",
    "AioLockError",
    "ClientClosedError",
    "Config",
    "FencedLock",
    "Lock",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeout",
    "RedisOperationError",
    "WrongEventLoopError",
    "alock",
    "configure",
    "from_url",
]
__version__ = "0.1.0"
