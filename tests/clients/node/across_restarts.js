// One official Node.js client (marklogic 3.7.1) kept for the life of this process, as Koop
// keeps it: it holds the first Digest nonce it is given and never asks for another. Each
// line on standard input makes one call; each call's outcome is a JSON line on standard
// output, so a test can restart the server between calls.
'use strict';
const readline = require('readline');
const marklogic = require('marklogic');

const [host, port, user, password] = process.argv.slice(2);
const db = marklogic.createDatabaseClient({
  host, port: Number(port), user, password, authType: 'DIGEST',
});

const lines = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
lines.on('line', () => {
  queue = queue.then(async () => {
    try {
      const r = await db.documents.probe('/absent.json').result();
      console.log(JSON.stringify({ ok: r.exists === false, result: r }));
    } catch (e) {
      console.log(JSON.stringify({ ok: false, error: String(e.statusCode || e.message) }));
    }
  });
});
lines.on('close', () => { queue.then(() => db.release()); });
