"""aiolock: asyncio-native distributed locks and synchronizers on Redis."""

from .client import AioLock as AioLock
from .client import ClientStatistics as ClientStatistics
from .client import from_url as from_url
from .client import red_lock as red_lock
from .config import Config as Config
from .default import aclose_default as aclose_default
from .default import alock as alock
from .default import configure as configure
from .default import lock_dependency as lock_dependency
from .default import locked as locked
from .errors import AioLockError as AioLockError
from .errors import ClientClosedError as ClientClosedError
from .errors import LockError as LockError
from .errors import LockLostError as LockLostError
from .errors import LockNotOwnedError as LockNotOwnedError
from .errors import LockStateError as LockStateError
from .errors import LockTimeout as LockTimeout
from .errors import LockUsageError as LockUsageError
from .errors import OutcomeUnknownError as OutcomeUnknownError
from .errors import RedisOperationError as RedisOperationError
from .errors import RedisTimeoutError as RedisTimeoutError
from .errors import RedisUnavailableError as RedisUnavailableError
from .errors import ReplicationError as ReplicationError
from .errors import SubscriptionError as SubscriptionError
from .errors import WrongEventLoopError as WrongEventLoopError
from .fair_lock import FairLock as FairLock
from .fenced_lock import FencedLock as FencedLock
from .holds import Owner as Owner
from .latch import CountDownLatch as CountDownLatch
from .latch import LatchStatistics as LatchStatistics
from .lock import Lock as Lock
from .lock import LockStatistics as LockStatistics
from .metrics import Metrics as Metrics
from .multilock import MultiLock as MultiLock
from .multilock import MultiLockStatistics as MultiLockStatistics
from .multilock import multi_lock as multi_lock
from .permit_semaphore import PermitExpirableSemaphore as PermitExpirableSemaphore
from .permit_semaphore import PermitStatistics as PermitStatistics
from .redlock import RedLock as RedLock
from .rwlock import ReadLock as ReadLock
from .rwlock import ReadWriteLock as ReadWriteLock
from .rwlock import WriteLock as WriteLock
from .semaphore import Semaphore as Semaphore
from .semaphore import SemaphoreStatistics as SemaphoreStatistics
from .spin_lock import SpinLock as SpinLock

__all__ = [
    "AioLock",
    "AioLockError",
    "ClientClosedError",
    "ClientStatistics",
    "Config",
    "CountDownLatch",
    "FairLock",
    "FencedLock",
    "LatchStatistics",
    "Lock",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockStateError",
    "LockStatistics",
    "LockTimeout",
    "LockUsageError",
    "Metrics",
    "MultiLock",
    "MultiLockStatistics",
    "OutcomeUnknownError",
    "Owner",
    "PermitExpirableSemaphore",
    "PermitStatistics",
    "ReadLock",
    "ReadWriteLock",
    "RedLock",
    "RedisOperationError",
    "RedisTimeoutError",
    "RedisUnavailableError",
    "ReplicationError",
    "Semaphore",
    "SemaphoreStatistics",
    "SpinLock",
    "SubscriptionError",
    "WriteLock",
    "WrongEventLoopError",
    "aclose_default",
    "alock",
    "configure",
    "from_url",
    "lock_dependency",
    "locked",
    "multi_lock",
    "red_lock",
]
__version__ = "0.1.0"
