-- spin_lock_force_unlock: delete a spin lock whoever holds it (nothing is published: its
-- waiters find it free at their next try).
-- KEYS[1]  the lock key
-- Returns  1 if a lock was deleted, 0 if there was none.
return redis.call('del', KEYS[1])
