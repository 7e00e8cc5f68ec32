// The official Node.js client (marklogic 3.7.1): a write the server refuses with a 400 before
// reading its body, then at once a read that must succeed, many times over one client (one keep-alive agent). The
// client used to fail the call after a 400 with "socket hang up". Prints a JSON summary.
'use strict';
const marklogic = require('marklogic');

const [host, port, user, password, rounds] = process.argv.slice(2);
const db = marklogic.createDatabaseClient({
  host, port: Number(port), user, password, authType: 'DIGEST',
});

async function main() {
  const errors = [];
  const refused = [];
  await db.documents.write({
    uri: '/node/good.json', contentType: 'application/json', content: { good: true },
  }).result();
  for (let i = 0; i < Number(rounds); i++) {
    try {
      // Refused on a parameter (a role that does not exist), before its body is read.
      await db.documents.write({
        uri: `/node/bad-${i}.json`,
        contentType: 'application/json',
        content: { pad: 'x'.repeat(64 * 1024) },
        permissions: [{ 'role-name': 'no-such-role', capabilities: ['read'] }],
      }).result();
      errors.push(`${i}: the bad write was accepted`);
    } catch (e) {
      refused.push(e.statusCode);
    }
    try {
      const docs = await db.documents.read('/node/good.json').result();
      if (!docs[0] || !docs[0].content || docs[0].content.good !== true) {
        errors.push(`${i}: read ${JSON.stringify(docs)}`);
      }
    } catch (e) {
      errors.push(`${i}: ${e.message}`);
    }
  }
  console.log(JSON.stringify({ rounds: Number(rounds), refused, errors }));
  db.release();
}

main().catch((e) => { console.log(JSON.stringify({ fatal: String(e && e.stack || e) })); });
