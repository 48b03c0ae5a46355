// A node-redisson (npm) lock user driven line by line from tests/test_node_redisson.py.
//
//   node node_redisson_peer.js HOST PORT      (NODE_PATH: where node-redisson and ioredis are)
//
// Commands on stdin, one per line; each runs at once (several may be under way), and answers
// one line on stdout starting with its tag:
//   owner TAG                      -> TAG <this client's id>            (owner = <id>:<client>)
//   lock TAG CLIENT NAME           -> TAG locked                         (waits, watchdog lease)
//   trylock TAG CLIENT NAME WAITMS -> TAG true|false <elapsed ms>
//   unlock TAG CLIENT NAME         -> TAG unlocked | TAG error <message>
//   loop TAG CLIENT NAME N         -> TAG looped N <overlaps>: N times lock (1 s lease); INCR "inside"
//                                     (an overlap if > 1); DECR; INCR "total"; unlock
//   quit TAG                       -> TAG bye, then exit
'use strict';

const readline = require('node:readline');
const { Redisson } = require('node-redisson');

const [host, port] = process.argv.slice(2);
const redisson = new Redisson({ redis: { options: { host, port: Number(port) } } });
const locks = new Map();

function lockOf(client, name) {
  const key = `${client}\u0000${name}`;
  if (!locks.has(key)) locks.set(key, redisson.getLock(name, client));
  return locks.get(key);
}

function say(...words) {
  process.stdout.write(words.join(' ') + '\n');
}

async function loop(tag, client, name, n) {
  const lock = lockOf(client, name);
  let overlaps = 0;
  for (let i = 0; i < n; i++) {
    await lock.lock(1000);
    if ((await redisson.redis.incr('inside')) > 1) {
      overlaps += 1;
      await redisson.redis.incr('overlaps');
    }
    if (i % 3 === 0) await new Promise((resolve) => setTimeout(resolve, 1));
    await redisson.redis.decr('inside');
    await redisson.redis.incr('total');
    await lock.unlock();
  }
  say(tag, 'looped', n, overlaps);
}

async function run(words) {
  const [command, tag, client, name, arg] = words;
  try {
    if (command === 'owner') {
      say(tag, redisson.commandExecutor.id);
    } else if (command === 'lock') {
      await lockOf(client, name).lock();
      say(tag, 'locked');
    } else if (command === 'trylock') {
      const started = Date.now();
      const got = await lockOf(client, name).tryLock(Number(arg));
      say(tag, got, Date.now() - started);
    } else if (command === 'unlock') {
      await lockOf(client, name).unlock();
      say(tag, 'unlocked');
    } else if (command === 'loop') {
      await loop(tag, client, name, Number(arg));
    } else if (command === 'quit') {
      await redisson.quit();
      say(tag, 'bye');
      process.exit(0);
    } else {
      say(tag, 'error', 'unknown command', command);
    }
  } catch (error) {
    say(tag, 'error', String(error && error.message ? error.message : error).replace(/\n/g, ' '));
  }
}

readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const words = line.trim().split(/\s+/);
  if (words[0]) run(words);
});
