// Preloaded into the original's runner scripts (NODE_OPTIONS=--require). Their primary process
// forks cluster workers that run autocannon, and calls process.exit once it has their results,
// leaving the workers to exit on their own after it: their CPU time would then be counted for no
// one. Here the primary's process.exit first ends its workers and waits until each has exited
// (10 s at most), so their CPU time is the primary's children's, which the bench reads when it
// reaps the primary. Nothing else the scripts do changes.
'use strict';
const cluster = require('cluster');

if (cluster.isPrimary) {
  const exit = process.exit.bind(process);
  process.exit = function (code) {
    const workers = Object.values(cluster.workers || {}).filter((w) => w && !w.isDead());
    if (workers.length === 0) return exit(code);
    let left = workers.length;
    const done = () => { if (--left === 0) exit(code); };
    for (const worker of workers) {
      worker.once('exit', done);
      worker.process.kill('SIGTERM');
    }
    setTimeout(() => exit(code), 10000).unref();
  };
}
