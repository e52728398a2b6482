// Preloaded into each Node process of the pipeline (NODE_OPTIONS=--require): counts the
// process's HTTP requests by route (push, pop, ack, other) and writes them, every second and
// at exit, to $QUEEN_BENCH_COUNTS/<pid>.json, which bench/pipeline.py adds up.
'use strict';
const fs = require('fs');
const path = require('path');
const counts = { push: 0, pop: 0, ack: 0, other: 0 };
const send = globalThis.fetch;
globalThis.fetch = function (url, ...rest) {
  const route = /\/api\/v1\/(push|pop|ack)\b/.exec(String(url));
  counts[route ? route[1] : 'other'] += 1;
  return send.call(this, url, ...rest);
};
const file = path.join(process.env.QUEEN_BENCH_COUNTS || '.', `${process.pid}.json`);
const save = () => fs.writeFileSync(file, JSON.stringify(counts));
setInterval(save, 1000).unref();
process.on('exit', save);
