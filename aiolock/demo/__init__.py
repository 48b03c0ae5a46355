"""``aiolock demo``: a flash sale (seckill) sold three ways across several worker processes.

Modules, in the order the data flows:

* :mod:`~aiolock.demo.cli`: the command line, progress bars and summary;
* :mod:`~aiolock.demo.server`: which Redis to use (or start a private one);
* :mod:`~aiolock.demo.runner`: one sale per strategy, run on a pool of workers, then counted;
* :mod:`~aiolock.demo.pool` and :mod:`~aiolock.demo.worker`: the worker processes and the
  JSON lines (:mod:`~aiolock.demo.messages`) they exchange with the runner;
* :mod:`~aiolock.demo.sale` and :mod:`~aiolock.demo.strategies`: the keys, and the naive /
  lock / lua ways of buying;
* :mod:`~aiolock.demo.orders` and :mod:`~aiolock.demo.db`: the lua strategy's orders, from a
  Redis Stream consumer group into SQLite or PostgreSQL;
* :mod:`~aiolock.demo.report`: results, checks and the summary table.
"""
