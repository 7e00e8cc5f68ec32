// The cluster page (/map/cluster) in Debian's Chromium through playwright-core: waits for its
// first answer and prints a JSON summary (state, summary line, the tables' cells, console
// errors); the Rust test decides what is right.
'use strict';
const { chromium } = require('playwright-core');

const [url, user, password, executable] = process.argv.slice(2);

async function main() {
  const browser = await chromium.launch({ executablePath: executable || '/usr/bin/chromium', args: ['--no-sandbox'] });
  try {
    const context = await browser.newContext({ httpCredentials: { username: user, password } });
    const page = await context.newPage();
    const consoleErrors = [];
    page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
    page.on('pageerror', (e) => consoleErrors.push(String(e)));
    await page.goto(`${url}/map/cluster`);
    await page.waitForFunction(() => ['ready', 'failed'].includes(document.body.dataset.state), null, { timeout: 30000 });
    const summary = await page.evaluate(() => {
      const cells = id => [...document.querySelectorAll(`#${id} tr`)].map(tr => [...tr.children].map(c => c.textContent));
      return {
        state: document.body.dataset.state,
        summary: document.getElementById('summary').textContent,
        nodes: cells('nodes'),
        shards: cells('shards'),
      };
    });
    console.log(JSON.stringify({ ...summary, consoleErrors }));
  } finally {
    await browser.close();
  }
}

main().catch((e) => { console.log(JSON.stringify({ fatal: String(e) })); process.exit(1); });
