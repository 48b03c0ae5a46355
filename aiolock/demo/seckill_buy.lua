-- seckill_buy: one flash-sale purchase, atomically (the demo's "lua" strategy).
-- Checks the stock and the one-per-user rule, takes one coupon, records the buyer and queues
-- the order on a stream for the database writers. Every key carries the {seckill} hash tag,
-- so all of them live in one cluster slot.
-- KEYS[1]  the stock: a string holding the coupons left
-- KEYS[2]  the buyers: a set of user ids
-- KEYS[3]  the orders stream (fields order_id, user_id)
-- ARGV[1]  user id
-- ARGV[2]  order id
-- Returns  0 bought (stock -1, buyer added, order queued); 1 sold out; 2 this user already
--          bought; an error if the sale has no stock key (not started).
local stock = tonumber(redis.call('get', KEYS[1]))
if stock == nil then
    return redis.error_reply('seckill: no stock at ' .. KEYS[1] .. ' (sale not started)')
end
if stock <= 0 then
    return 1
end
if redis.call('sismember', KEYS[2], ARGV[1]) == 1 then
    return 2
end
redis.call('decr', KEYS[1])
redis.call('sadd', KEYS[2], ARGV[1])
redis.call('xadd', KEYS[3], '*', 'order_id', ARGV[2], 'user_id', ARGV[1])
return 0
