"""A Redisson stand-in, in a process of its own, for the interop tests: Redisson's own Lua and
waiting loops as ../shared/REDISSON.md describes them (Redisson's layouts, its client-clock
timestamps, its messages), never aiolock's, run with redis-py. It runs one of two ways.

Locks (sections 3 and 4: the fair lock and the read-write lock, Redisson's RedissonFairLock,
RedissonReadLock and RedissonWriteLock scripts, unlock latch included): a long-lived client
that waits the way Redisson's does (try, subscribe, try again, wait for a message at most the
returned TTL, try again...). Each logical Java thread is a Python thread; its lock name is
``<client uuid>:<thread id>`` (the writer's ``...:write``), Redisson's. Driven by lines on
stdin, it reports on stdout:

    <tid> fair-lock NAME WAIT_MS LEASE_MS   tryLock(wait, lease) of RFairLock; WAIT_MS -1: lock()
    <tid> fair-unlock NAME
    <tid> read-lock NAME WAIT_MS LEASE_MS   readLock().tryLock / lock()
    <tid> read-unlock NAME
    <tid> write-lock NAME WAIT_MS LEASE_MS
    <tid> write-unlock NAME
    quit

    -> "ready <client uuid>" once, then per command "<tid> acquired|timeout|unlocked|error ..."
       ("acquired" carries time.monotonic_ns(), CLOCK_MONOTONIC, comparable across processes)

On a Redis Cluster (``URL`` = ``redis+cluster://HOST:PORT``) it runs on redis-py's
RedisCluster and chooses pub/sub as Redisson's ClusterConnectionManager does: sharded
(SSUBSCRIBE on the channel's master, SPUBLISH passed to the scripts) if ``PUBSUB SHARDNUMSUB
0`` is understood (Redis 7), classic otherwise.

``python tests/redisson_peer.py URL [CLOCK_OFFSET_MS]``: the offset skews the clock this
client writes into fair-lock deadlines (Redisson passes System.currentTimeMillis()).

Synchronizers (sections 5 and 6: RSemaphore, RPermitExpirableSemaphore, RCountDownLatch):
one command per process, ``python tests/redisson_peer.py COMMAND URL NAME ...``:

redisson_peer.py sem-acquire URL NAME PERMITS TIMEOUT   "waiting" (if it must wait), then
                                                        "acquired" or "timeout"
redisson_peer.py sem-release URL NAME PERMITS           "released N" (the new count)
redisson_peer.py sem-hammer URL NAME PERMITS ROUNDS     ROUNDS x acquire 1, the guard of
                                                        tests/sync_worker.py, release; "done"
redisson_peer.py pes-acquire URL NAME LEASE_MS TIMEOUT  LEASE_MS -1: never expires;
                                                        "waiting", then "acquired <id>" or
                                                        "timeout"
redisson_peer.py pes-release URL NAME ID                "released" or "failed"
redisson_peer.py pes-hammer URL NAME PERMITS ROUNDS     as sem-hammer, with a 10 s lease
redisson_peer.py latch-await URL NAME TIMEOUT           "waiting" (if closed), then "open" or
                                                        "timeout"
redisson_peer.py latch-count-down URL NAME              "counted"
redisson_peer.py latch-delete URL NAME                  "deleted N"

The fenced lock (section 7.4: RFencedLock, RedissonFencedLock's token-returning acquire, then
RLock's unlock with its latch), one command per process too:

redisson_peer.py fenced-lock URL NAME LEASE_MS          one tryLockAndGetToken attempt:
                                                        "token N" then, unlocked, "unlocked";
                                                        or "held PTTL" (someone holds it)
"""

from __future__ import annotations

import os
import queue
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from redis.client import PubSub

CLUSTER_SCHEME = "redis+cluster://"


def connect(url: str) -> Any:
    """redis.Redis for ``url``, or redis.RedisCluster for a ``redis+cluster://`` URL."""
    if url.startswith(CLUSTER_SCHEME):
        return redis.RedisCluster.from_url("redis://" + url.removeprefix(CLUSTER_SCHEME))
    return redis.Redis.from_url(url)


def sharded_pubsub(r: Any) -> bool:
    """Redisson's probe: a cluster whose nodes answer PUBSUB SHARDNUMSUB uses sharded pub/sub."""
    if not isinstance(r, redis.RedisCluster):
        return False
    node = r.get_default_node()  # type: ignore[no-untyped-call]
    with redis.Redis(host=node.host, port=node.port) as plain:
        try:
            plain.execute_command("PUBSUB", "SHARDNUMSUB", "0")
        except redis.ResponseError:
            return False
    return True


def subscribe(r: Any, channel: str) -> PubSub:
    """A pub/sub connection listening to ``channel`` (confirmed): on a cluster, on the
    channel's master, with SSUBSCRIBE when sharded (as Redisson)."""
    if isinstance(r, redis.RedisCluster):
        node = r.get_node_from_key(channel)  # type: ignore[no-untyped-call]
        pubsub: PubSub = redis.Redis(host=node.host, port=node.port).pubsub()  # type: ignore[no-untyped-call]
    else:
        pubsub = r.pubsub()
    kind = "ssubscribe" if SHARDED[0] else "subscribe"
    if SHARDED[0]:
        pubsub.ssubscribe(channel)
    else:
        pubsub.subscribe(channel)
    while True:
        confirmation = pubsub.get_message(timeout=5)
        if confirmation is not None and confirmation["type"] == kind:
            return pubsub


#: [whether pub/sub is sharded], set at start-up
SHARDED = [False]
#: [the publish command passed to scripts], set at start-up
PUBLISH_COMMAND = ["PUBLISH"]
MESSAGES = ("message", "smessage")

FAIR_LOCK_WAIT_TIMEOUT_MS = 300_000  # Config.fairLockWaitTimeout
LATCH_PX = 18_000  # redisson_unlock_latch PX with the default timeouts

# -- RedissonFairLock ------------------------------------------------------------------------

# KEYS [N, Q, T]; ARGV [leaseMs, lockName, wait, now] (tryLockInnerAsync, EVAL_LONG)
FAIR_ACQUIRE = """
while true do
    local firstThreadId2 = redis.call('lindex', KEYS[2], 0);
    if firstThreadId2 == false then break; end;
    local timeout = redis.call('zscore', KEYS[3], firstThreadId2);
    if timeout ~= false and tonumber(timeout) <= tonumber(ARGV[4]) then
        redis.call('zrem', KEYS[3], firstThreadId2);
        redis.call('lpop', KEYS[2]);
    else break; end;
end;
if (redis.call('exists', KEYS[1]) == 0)
    and ((redis.call('exists', KEYS[2]) == 0)
        or (redis.call('lindex', KEYS[2], 0) == ARGV[2])) then
    redis.call('lpop', KEYS[2]);
    redis.call('zrem', KEYS[3], ARGV[2]);
    local keys = redis.call('zrange', KEYS[3], 0, -1);
    for i = 1, #keys, 1 do
        redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), keys[i]);
    end;
    redis.call('hset', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
local timeout = redis.call('zscore', KEYS[3], ARGV[2]);
if timeout ~= false then
    local ttl = redis.call('pttl', KEYS[1]);
    return math.max(0, ttl);
end;
local lastThreadId = redis.call('lindex', KEYS[2], -1);
local ttl;
if lastThreadId ~= false and lastThreadId ~= ARGV[2]
    and redis.call('zscore', KEYS[3], lastThreadId) ~= false then
    ttl = tonumber(redis.call('zscore', KEYS[3], lastThreadId)) - tonumber(ARGV[4]);
else
    ttl = redis.call('pttl', KEYS[1]);
end;
local timeout = ttl + tonumber(ARGV[3]) + tonumber(ARGV[4]);
if redis.call('zadd', KEYS[3], timeout, ARGV[2]) == 1 then
    redis.call('rpush', KEYS[2], ARGV[2]);
end;
return ttl;
"""

# KEYS [N, Q, T, channelPrefix, latch]; ARGV [0, leaseMs, lockName, now, publishCmd, latchPx]
FAIR_UNLOCK = """
local val = redis.call('get', KEYS[5]);
if val ~= false then return tonumber(val); end;
while true do
    local firstThreadId2 = redis.call('lindex', KEYS[2], 0);
    if firstThreadId2 == false then break; end;
    local timeout = redis.call('zscore', KEYS[3], firstThreadId2);
    if timeout ~= false and tonumber(timeout) <= tonumber(ARGV[4]) then
        redis.call('zrem', KEYS[3], firstThreadId2);
        redis.call('lpop', KEYS[2]);
    else break; end;
end;
if (redis.call('exists', KEYS[1]) == 0) then
    local nextThreadId = redis.call('lindex', KEYS[2], 0);
    if nextThreadId ~= false then
        redis.call(ARGV[5], KEYS[4] .. ':' .. nextThreadId, ARGV[1]);
    end;
    redis.call('set', KEYS[5], 1, 'px', ARGV[6]);
    return 1;
end;
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end;
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
if (counter > 0) then
    redis.call('pexpire', KEYS[1], ARGV[2]);
    redis.call('set', KEYS[5], 0, 'px', ARGV[6]);
    return 0;
end;
redis.call('del', KEYS[1]);
redis.call('set', KEYS[5], 1, 'px', ARGV[6]);
local nextThreadId = redis.call('lindex', KEYS[2], 0);
if nextThreadId ~= false then
    redis.call(ARGV[5], KEYS[4] .. ':' .. nextThreadId, ARGV[1]);
end;
return 1;
"""

# KEYS [Q, T]; ARGV [lockName, wait] (acquireFailedAsync)
FAIR_ACQUIRE_FAILED = """
local queue = redis.call('lrange', KEYS[1], 0, -1);
local i = 1;
while i <= #queue and queue[i] ~= ARGV[1] do i = i + 1; end;
i = i + 1;
while i <= #queue do
    redis.call('zincrby', KEYS[2], -tonumber(ARGV[2]), queue[i]);
    i = i + 1;
end;
redis.call('zrem', KEYS[2], ARGV[1]);
redis.call('lrem', KEYS[1], 0, ARGV[1]);
"""

# -- RedissonReadLock / RedissonWriteLock ----------------------------------------------------

# KEYS [N, timeoutPrefix]; ARGV [leaseMs, lockName, writeLockName]
READ_ACQUIRE = """
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
    redis.call('hset', KEYS[1], 'mode', 'read');
    redis.call('hset', KEYS[1], ARGV[2], 1);
    redis.call('set', KEYS[2] .. ':1', 1);
    redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
    local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1);
    local key = KEYS[2] .. ':' .. ind;
    redis.call('set', key, 1);
    redis.call('pexpire', key, ARGV[1]);
    local remainTime = redis.call('pttl', KEYS[1]);
    redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1]));
    return nil;
end;
return redis.call('pttl', KEYS[1]);
"""

# KEYS [N, channel, timeoutPrefix, keyPrefix, latch]; ARGV [0, lockName, publishCmd, latchPx]
READ_UNLOCK = """
local val = redis.call('get', KEYS[5]);
if val ~= false then return tonumber(val); end;
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
    redis.call(ARGV[3], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[5], 1, 'px', ARGV[4]);
    return nil;
end;
local lockExists = redis.call('hexists', KEYS[1], ARGV[2]);
if (lockExists == 0) then return nil; end;
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1);
if (counter == 0) then redis.call('hdel', KEYS[1], ARGV[2]); end;
redis.call('del', KEYS[3] .. ':' .. (counter + 1));
if (redis.call('hlen', KEYS[1]) > 1) then
    local maxRemainTime = -3;
    local keys = redis.call('hkeys', KEYS[1]);
    for n, key in ipairs(keys) do
        counter = tonumber(redis.call('hget', KEYS[1], key));
        if type(counter) == 'number' then
            for i = counter, 1, -1 do
                local remainTime = redis.call('pttl',
                    KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i);
                maxRemainTime = math.max(remainTime, maxRemainTime);
            end;
        end;
    end;
    if maxRemainTime > 0 then
        redis.call('pexpire', KEYS[1], maxRemainTime);
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]);
        return 0;
    end;
    if mode == 'write' then
        redis.call('set', KEYS[5], 0, 'px', ARGV[4]);
        return 0;
    end;
end;
redis.call('del', KEYS[1]);
redis.call(ARGV[3], KEYS[2], ARGV[1]);
redis.call('set', KEYS[5], 1, 'px', ARGV[4]);
return 1;
"""

# KEYS [N]; ARGV [leaseMs, writeLockName]
WRITE_ACQUIRE = """
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
    redis.call('hset', KEYS[1], 'mode', 'write');
    redis.call('hset', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
if (mode == 'write') then
    if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
        redis.call('hincrby', KEYS[1], ARGV[2], 1);
        local currentExpire = redis.call('pttl', KEYS[1]);
        redis.call('pexpire', KEYS[1], currentExpire + ARGV[1]);
        return nil;
    end;
end;
return redis.call('pttl', KEYS[1]);
"""

# KEYS [N, channel, latch]; ARGV [1, leaseMs, writeLockName, publishCmd, latchPx]
WRITE_UNLOCK = """
local val = redis.call('get', KEYS[3]);
if val ~= false then return tonumber(val); end;
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
    redis.call(ARGV[4], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
    return nil;
end;
if (mode == 'write') then
    local lockExists = redis.call('hexists', KEYS[1], ARGV[3]);
    if (lockExists == 0) then
        return nil;
    else
        local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
        if (counter > 0) then
            redis.call('pexpire', KEYS[1], ARGV[2]);
            redis.call('set', KEYS[3], 0, 'px', ARGV[5]);
            return 0;
        else
            redis.call('hdel', KEYS[1], ARGV[3]);
            if (redis.call('hlen', KEYS[1]) == 1) then
                redis.call('del', KEYS[1]);
                redis.call(ARGV[4], KEYS[2], ARGV[1]);
            else
                redis.call('hset', KEYS[1], 'mode', 'read');
            end;
            redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
            return 1;
        end;
    end;
end;
return nil;
"""


def prefix_name(prefix: str, name: str) -> str:
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


def suffix_name(name: str, suffix: str) -> str:
    return f"{name}:{suffix}" if "{" in name else f"{{{name}}}:{suffix}"


class Peer:
    """One Redisson client (RedissonClient): its uuid, connections and scripts."""

    def __init__(self, url: str, clock_offset_ms: int) -> None:
        self.id = str(uuid.uuid4())
        self.url = url
        self.redis = connect(url)
        SHARDED[0] = sharded_pubsub(self.redis)
        PUBLISH_COMMAND[0] = "SPUBLISH" if SHARDED[0] else "PUBLISH"
        self.clock_offset_ms = clock_offset_ms
        self.scripts = {
            name: self.redis.register_script(source)
            for name, source in {
                "fair_acquire": FAIR_ACQUIRE,
                "fair_unlock": FAIR_UNLOCK,
                "fair_failed": FAIR_ACQUIRE_FAILED,
                "read_acquire": READ_ACQUIRE,
                "read_unlock": READ_UNLOCK,
                "write_acquire": WRITE_ACQUIRE,
                "write_unlock": WRITE_UNLOCK,
            }.items()
        }
        self.out_lock = threading.Lock()

    def now(self) -> int:
        return int(time.time() * 1000) + self.clock_offset_ms

    def say(self, *words: object) -> None:
        with self.out_lock:
            print(*words, flush=True)

    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self.scripts[name](keys=keys, args=args)

    # -- the waiting loop of RedissonLock.tryLock(waitTime, leaseTime) ------------------------

    def wait_loop(
        self,
        channel: str,
        attempt: Callable[[], int | None],
        wait_ms: int,
        failed: Callable[[], None],
    ) -> bool:
        """Redisson's loop: try; subscribe; try again; park for min(ttl, time left) on the
        channel; ... ``wait_ms`` < 0: lock() (no limit; a negative ttl parks untimed)."""
        deadline = None if wait_ms < 0 else time.monotonic() + wait_ms / 1000
        ttl = attempt()
        if ttl is None:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            failed()
            return False
        pubsub = subscribe(self.redis, channel)
        try:
            while True:
                ttl = attempt()
                if ttl is None:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    failed()
                    return False
                park: float | None
                if ttl >= 0:
                    park = ttl / 1000 if left is None else min(ttl / 1000, left)
                else:
                    park = left  # Redisson: latch.acquire() without a timer
                self._park(pubsub, park)
        finally:
            pubsub.close()

    @staticmethod
    def _park(pubsub: redis.client.PubSub, seconds: float | None) -> None:
        end = None if seconds is None else time.monotonic() + seconds
        while True:
            left = 1.0 if end is None else end - time.monotonic()
            if left <= 0:
                return
            message = pubsub.get_message(timeout=min(left, 1.0))
            if message is not None and message["type"] in MESSAGES:
                return

    # -- RFairLock ------------------------------------------------------------------------

    def fair_lock(self, tid: str, name: str, wait_ms: int, lease_ms: int) -> bool:
        owner = f"{self.id}:{tid}"
        keys = [name, prefix_name("redisson_lock_queue", name)]
        keys.append(prefix_name("redisson_lock_timeout", name))
        wait = wait_ms if wait_ms > 0 else FAIR_LOCK_WAIT_TIMEOUT_MS

        def attempt() -> int | None:
            reply = self.run("fair_acquire", keys, [lease_ms, owner, wait, self.now()])
            return None if reply is None else int(reply)

        def failed() -> None:
            self.run("fair_failed", keys[1:], [owner, wait])

        channel = f"{prefix_name('redisson_lock__channel', name)}:{owner}"
        return self.wait_loop(channel, attempt, wait_ms, failed)

    def fair_unlock(self, tid: str, name: str) -> Any:
        owner = f"{self.id}:{tid}"
        latch = f"{prefix_name('redisson_unlock_latch', name)}:{os.urandom(16).hex()}"
        keys = [
            name,
            prefix_name("redisson_lock_queue", name),
            prefix_name("redisson_lock_timeout", name),
            prefix_name("redisson_lock__channel", name),
            latch,
        ]
        args = [0, 30_000, owner, self.now(), PUBLISH_COMMAND[0], LATCH_PX]
        reply = self.run("fair_unlock", keys, args)
        self.redis.delete(latch)
        return reply

    # -- RReadWriteLock -------------------------------------------------------------------

    def read_lock(self, tid: str, name: str, wait_ms: int, lease_ms: int) -> bool:
        owner = f"{self.id}:{tid}"
        keys = [name, suffix_name(name, owner) + ":rwlock_timeout"]

        def attempt() -> int | None:
            reply = self.run("read_acquire", keys, [lease_ms, owner, owner + ":write"])
            return None if reply is None else int(reply)

        channel = prefix_name("redisson_rwlock", name)
        return self.wait_loop(channel, attempt, wait_ms, lambda: None)

    def read_unlock(self, tid: str, name: str) -> Any:
        owner = f"{self.id}:{tid}"
        timeout_prefix = suffix_name(name, owner) + ":rwlock_timeout"
        key_prefix = timeout_prefix.split(":" + owner)[0]
        latch = f"{prefix_name('redisson_unlock_latch', name)}:{os.urandom(16).hex()}"
        keys = [name, prefix_name("redisson_rwlock", name), timeout_prefix, key_prefix, latch]
        reply = self.run("read_unlock", keys, [0, owner, PUBLISH_COMMAND[0], LATCH_PX])
        self.redis.delete(latch)
        return reply

    def write_lock(self, tid: str, name: str, wait_ms: int, lease_ms: int) -> bool:
        writer = f"{self.id}:{tid}:write"

        def attempt() -> int | None:
            reply = self.run("write_acquire", [name], [lease_ms, writer])
            return None if reply is None else int(reply)

        channel = prefix_name("redisson_rwlock", name)
        return self.wait_loop(channel, attempt, wait_ms, lambda: None)

    def write_unlock(self, tid: str, name: str) -> Any:
        writer = f"{self.id}:{tid}:write"
        latch = f"{prefix_name('redisson_unlock_latch', name)}:{os.urandom(16).hex()}"
        keys = [name, prefix_name("redisson_rwlock", name), latch]
        reply = self.run("write_unlock", keys, [1, 30_000, writer, PUBLISH_COMMAND[0], LATCH_PX])
        self.redis.delete(latch)
        return reply


class JavaThread(threading.Thread):
    """One thread of the peer: runs its commands in order."""

    def __init__(self, peer: Peer, tid: str) -> None:
        super().__init__(daemon=True)
        self.peer = peer
        self.tid = tid
        self.commands: queue.Queue[list[str]] = queue.Queue()

    def run(self) -> None:
        peer, tid = self.peer, self.tid
        while True:
            words = self.commands.get()
            op, name = words[0], words[1]
            try:
                if op.endswith("-lock"):
                    wait_ms, lease_ms = int(words[2]), int(words[3])
                    method = getattr(peer, op.replace("-", "_"))
                    if method(tid, name, wait_ms, lease_ms):
                        peer.say(tid, "acquired", time.monotonic_ns())
                    else:
                        peer.say(tid, "timeout")
                else:
                    reply = getattr(peer, op.replace("-", "_"))(tid, name)
                    peer.say(tid, "unlocked", reply)
            except Exception as exc:  # reported, the thread goes on
                peer.say(tid, "error", repr(exc).replace("\n", " "))


# == the synchronizers (REDISSON.md 5 and 6) ==============================================

NON_EXPIRABLE = 922337203685477
PUBLISH = "PUBLISH"

# -- RSemaphore (REDISSON.md 5.1) -----------------------------------------------------------

SEM_TRY_ACQUIRE = """
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
    redis.call('decrby', KEYS[1], ARGV[1]);
    return 1;
end;
return 0;
"""
SEM_RELEASE = """
local value = redis.call('incrby', KEYS[1], ARGV[1]);
redis.call(ARGV[2], KEYS[2], value);
return value;
"""

# -- RPermitExpirableSemaphore (REDISSON.md 5.2) --------------------------------------------

PES_TRY_ACQUIRE = """
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1]);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[2], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[5], KEYS[3], value);
    end;
end;
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
    redis.call('decrby', KEYS[1], ARGV[1]);
    for i = 6, #ARGV, 1 do
        redis.call('zadd', KEYS[2], ARGV[2], ARGV[i]);
    end;
    local ttl = redis.call('pttl', KEYS[1]);
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl);
    end;
    return 'OK';
end;
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES');
if v[1] ~= nil and v[2] ~= ARGV[4] then
    return ':' .. tostring(v[2]);
end
return nil;
"""
PES_TRY_RELEASE = """
local expire = redis.call('zscore', KEYS[3], ARGV[1]);
local removed = redis.call('zrem', KEYS[3], ARGV[1]);
if tonumber(removed) ~= 1 then
    return 0;
end;
local value = redis.call('incrby', KEYS[1], ARGV[2]);
redis.call(ARGV[4], KEYS[2], value);
if tonumber(expire) <= tonumber(ARGV[3]) then
    return 0;
end;
return 1;
"""

# -- RCountDownLatch (REDISSON.md 6) --------------------------------------------------------

LATCH_COUNT_DOWN = """
local v = redis.call('decr', KEYS[1]);
if v <= 0 then redis.call('del', KEYS[1]) end;
if v == 0 then redis.call(ARGV[2], KEYS[2], ARGV[1]) end;
"""
LATCH_DELETE = """
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1
else
    return 0
end
"""

# -- RFencedLock (REDISSON.md 7.4) and RLock's unlock (2.2) ---------------------------------

# KEYS [N, redisson_lock_token:{N}]; ARGV [leaseMs, lockName]: INCR on every acquisition,
# reentrant ones included, whatever the counter holds; {-1, token} or {pttl, -1}
FENCED_ACQUIRE = """
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    local token = redis.call('incr', KEYS[2]);
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return {-1, token};
end;
return {redis.call('pttl', KEYS[1]), -1};
"""
# KEYS [N, channel, latch]; ARGV [0, leaseMs, lockName, publishCmd, latchPx]
LOCK_UNLOCK = """
local val = redis.call('get', KEYS[3]);
if val ~= false then return tonumber(val); end;
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil; end;
if redis.call('hincrby', KEYS[1], ARGV[3], -1) > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2]);
    redis.call('set', KEYS[3], 0, 'px', ARGV[5]);
    return 0;
end;
redis.call('del', KEYS[1]);
redis.call(ARGV[4], KEYS[2], ARGV[1]);
redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
return 1;
"""

#: tests/sync_worker.py's guard
ENTER = """
redis.call('sadd', KEYS[1], ARGV[1])
local inside = redis.call('scard', KEYS[1])
if inside > tonumber(ARGV[2]) then
    redis.call('incr', KEYS[2])
end
return inside
"""


def now_ms() -> int:
    return int(time.time() * 1000)  # Redisson: the client's clock


def say(*words: object) -> None:
    print(*words, flush=True)


def wait_message(pubsub: PubSub, seconds: float) -> bytes | None:
    """The next message's payload within ``seconds`` (Redisson's latch.tryAcquire)."""
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        got: Any = pubsub.get_message(timeout=left)
        if got is not None and got["type"] in MESSAGES:
            data = got["data"]
            assert isinstance(data, bytes)
            return data


class SyncPeer:
    """A Redisson client using one semaphore or latch (one command per process)."""

    def __init__(self, url: str, name: str) -> None:
        self.r = connect(url)
        SHARDED[0] = sharded_pubsub(self.r)
        self.publish = "SPUBLISH" if SHARDED[0] else PUBLISH
        self.name = name
        self.sem_channel = prefix_name("redisson_sc", name)
        self.timeouts = suffix_name(name, "timeout")
        self.latch_channel = "redisson_countdownlatch__channel__{" + name + "}"
        self.quiet = False

    def waiting(self) -> None:
        if not self.quiet:
            say("waiting")

    # RSemaphore
    def sem_try(self, permits: int) -> bool:
        return bool(self.r.eval(SEM_TRY_ACQUIRE, 1, self.name, permits))

    def sem_acquire(self, permits: int, timeout: float) -> bool:
        """Fast try, subscribe, then {try; wait for a message} until the time is up."""
        if self.sem_try(permits):
            return True
        deadline = time.monotonic() + timeout
        pubsub = subscribe(self.r, self.sem_channel)
        self.waiting()
        try:
            while True:
                if self.sem_try(permits):
                    return True
                if time.monotonic() >= deadline:
                    return False
                wait_message(pubsub, deadline - time.monotonic())
        finally:
            pubsub.close()

    def sem_release(self, permits: int) -> int:
        return int(self.r.eval(SEM_RELEASE, 2, self.name, self.sem_channel, permits, self.publish))

    # RPermitExpirableSemaphore
    def pes_try(self, permit: bytes, lease_ms: int) -> Any:
        timeout_date = NON_EXPIRABLE if lease_ms < 0 else now_ms() + lease_ms
        args: list[bytes | str | int] = [
            1,
            timeout_date,
            now_ms(),
            NON_EXPIRABLE,
            self.publish,
            permit,
        ]
        keys = [self.name, self.timeouts, self.sem_channel]
        return self.r.eval(PES_TRY_ACQUIRE, 3, *keys, *args)

    def pes_acquire(self, lease_ms: int, timeout: float) -> str | None:
        permit = os.urandom(16)
        deadline = time.monotonic() + timeout
        pubsub: PubSub | None = None
        try:
            while True:
                result = self.pes_try(permit, lease_ms)
                if result == b"OK":
                    return permit.hex()
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if pubsub is None:
                    pubsub = subscribe(self.r, self.sem_channel)
                    self.waiting()
                    continue  # try again once subscribed
                if result is not None:  # ':<score>': wake when the nearest permit expires
                    left = min(left, int(result[1:]) - now_ms() + 1) / 1000
                wait_message(pubsub, left)
        finally:
            if pubsub is not None:
                pubsub.close()

    def pes_release(self, permit: str) -> bool:
        keys = [self.name, self.sem_channel, self.timeouts]
        args: list[bytes | str | int] = [bytes.fromhex(permit), 1, now_ms(), self.publish]
        return bool(self.r.eval(PES_TRY_RELEASE, 3, *keys, *args))

    # RCountDownLatch
    def count(self) -> int:
        value = self.r.get(self.name)
        return 0 if value is None else int(value)

    def latch_await(self, timeout: float) -> bool:
        if self.count() == 0:
            return True
        deadline = time.monotonic() + timeout
        pubsub = subscribe(self.r, self.latch_channel)
        self.waiting()
        is_open = False
        try:
            while self.count() > 0:
                # the ReclosableLatch: "0" opens it, "1" closes it; a closed latch blocks
                while not is_open:
                    data = wait_message(pubsub, deadline - time.monotonic())
                    if data is None:
                        return False
                    is_open = data == b"0"
                is_open = False
            return True
        finally:
            pubsub.close()

    def latch_count_down(self) -> None:
        self.r.eval(LATCH_COUNT_DOWN, 2, self.name, self.latch_channel, 0, self.publish)

    def latch_delete(self) -> int:
        return int(self.r.eval(LATCH_DELETE, 2, self.name, self.latch_channel, 1, self.publish))

    # contention
    def hammer(self, kind: str, permits: int, rounds: int) -> None:
        keys = [f"inside:{self.name}", f"overlaps:{self.name}"]
        member = f"peer-{os.getpid()}"
        self.quiet = True
        for _ in range(rounds):
            if kind == "sem":
                assert self.sem_acquire(1, 30)
            else:
                acquired = self.pes_acquire(10_000, 30)
                assert acquired is not None
                permit = acquired
            self.r.eval(ENTER, 2, *keys, member, permits)
            time.sleep(random.uniform(0.001, 0.005))
            self.r.srem(keys[0], member)
            if kind == "sem":
                self.sem_release(1)
            else:
                assert self.pes_release(permit)
        say("done")


def fenced_lock(url: str, name: str, lease_ms: int) -> None:
    """One RFencedLock.tryLockAndGetToken() of a fresh client's thread 1, then its unlock."""
    r = connect(url)
    publish = "SPUBLISH" if sharded_pubsub(r) else PUBLISH
    owner = f"{uuid.uuid4()}:1"
    token_key = prefix_name("redisson_lock_token", name)
    ttl, token = (int(x) for x in r.eval(FENCED_ACQUIRE, 2, name, token_key, lease_ms, owner))
    if ttl != -1:
        say("held", ttl)
        return
    say("token", token)
    latch = f"{prefix_name('redisson_unlock_latch', name)}:{os.urandom(16).hex()}"
    channel = prefix_name("redisson_lock__channel", name)
    assert r.eval(LOCK_UNLOCK, 3, name, channel, latch, 0, lease_ms, owner, publish, LATCH_PX) == 1
    r.delete(latch)
    say("unlocked")


def sync_main(command: str, url: str, name: str, *rest: str) -> None:
    if command == "fenced-lock":
        fenced_lock(url, name, int(rest[0]))
        return
    peer = SyncPeer(url, name)
    if command == "sem-acquire":
        say("acquired" if peer.sem_acquire(int(rest[0]), float(rest[1])) else "timeout")
    elif command == "sem-release":
        say("released", peer.sem_release(int(rest[0])))
    elif command in ("sem-hammer", "pes-hammer"):
        peer.hammer(command[:3], int(rest[0]), int(rest[1]))
    elif command == "pes-acquire":
        permit = peer.pes_acquire(int(rest[0]), float(rest[1]))
        say("timeout" if permit is None else f"acquired {permit}")
    elif command == "pes-release":
        say("released" if peer.pes_release(rest[0]) else "failed")
    elif command == "latch-await":
        say("open" if peer.latch_await(float(rest[0])) else "timeout")
    elif command == "latch-count-down":
        peer.latch_count_down()
        say("counted")
    elif command == "latch-delete":
        say("deleted", peer.latch_delete())
    else:
        raise SystemExit(f"unknown command {command!r}")


def locks_main(url: str, *rest: str) -> None:
    offset = int(rest[0]) if rest else 0
    peer = Peer(url, offset)
    peer.redis.ping()
    threads: dict[str, JavaThread] = {}
    peer.say("ready", peer.id)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        tid = words[0]
        if tid not in threads:
            threads[tid] = JavaThread(peer, tid)
            threads[tid].start()
        threads[tid].commands.put(words[1:])


SYNC_COMMANDS = frozenset(
    {
        "sem-acquire",
        "sem-release",
        "sem-hammer",
        "pes-acquire",
        "pes-release",
        "pes-hammer",
        "latch-await",
        "latch-count-down",
        "latch-delete",
        "fenced-lock",
    }
)


def main(*argv: str) -> None:
    if argv and argv[0] in SYNC_COMMANDS:
        sync_main(*argv)
    else:
        locks_main(*argv)


if __name__ == "__main__":
    main(*sys.argv[1:])
