// One official Node.js client (marklogic 3.7.1) calling for a while, a call every 100 ms: it
// keeps the first Digest nonce it was given and never asks for another. Prints a JSON summary.
'use strict';
const marklogic = require('marklogic');

const [host, port, user, password, ms] = process.argv.slice(2);
const db = marklogic.createDatabaseClient({
  host, port: Number(port), user, password, authType: 'DIGEST',
});

async function main() {
  const errors = [];
  let calls = 0;
  const end = Date.now() + Number(ms);
  while (Date.now() < end) {
    try {
      const r = await db.documents.probe('/absent.json').result();
      if (r.exists !== false) errors.push(`call ${calls}: ${JSON.stringify(r)}`);
    } catch (e) {
      errors.push(`call ${calls}: ${e.statusCode || e.message}`);
    }
    calls += 1;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  console.log(JSON.stringify({ calls, errors }));
  db.release();
}

main().catch((e) => { console.log(JSON.stringify({ fatal: String(e && e.stack || e) })); });
