// The map page's fences in a real browser: opens the page, waits until it follows the fences,
// makes the writes it is given (PUTs of documents, from Node with Basic authentication), then
// waits for the page to list `want` events. Prints a JSON summary of what the page listed and
// drew; the Rust test decides what is right.
'use strict';
const { openBrowser } = require('./browser');

const [url, user, password, view, writesJson, want, screenshot, executable] = process.argv.slice(2);

async function main() {
  const { browser, page, consoleErrors, failed } = await openBrowser(user, password, executable);
  try {
    await page.goto(`${url}/`);
    await page.waitForFunction(() => ['ready', 'failed'].includes(document.body.dataset.state),
      null, { timeout: 60000 });
    const state = await page.evaluate(() => document.body.dataset.state);
    if (state !== 'ready') {
      console.log(JSON.stringify({ state, status: await page.textContent('#status'), consoleErrors, failed }));
      return;
    }
    const [zoom, lat, lon] = view.split('/').map(Number);
    await page.evaluate(([z, x, y]) => window.geoshard.map.jumpTo({ zoom: z, center: [x, y] }), [zoom, lon, lat]);
    // Every listed fence that is followed has its stream open before the writes.
    await page.waitForFunction(() => {
      const followed = [...document.querySelectorAll('#fences li')].filter((li) => li.querySelector('input').checked);
      return followed.length > 0 && followed.every((li) => li.dataset.following === 'yes');
    }, null, { timeout: 30000 });
    const fences = await page.$$eval('#fences li', (lis) => lis.map((li) => ({
      name: li.dataset.fence,
      following: li.dataset.following,
      meta: li.querySelector('.meta').textContent,
    })));

    const auth = `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
    const writes = JSON.parse(writesJson);
    const answers = [];
    for (const w of writes) {
      const r = await fetch(`${url.replace(/\/\/[^@]*@/, '//')}/v1/documents?uri=${encodeURIComponent(w.uri)}&collection=${encodeURIComponent(w.collection)}`, {
        method: 'PUT',
        headers: { Authorization: auth, 'Content-Type': 'application/json' },
        body: JSON.stringify(w.body),
      });
      answers.push(r.status);
      await new Promise((res) => setTimeout(res, 200));
    }
    let complete = true;
    await page.waitForFunction((n) => document.querySelectorAll('#events li[data-id]').length >= Number(n),
      want, { timeout: 20000 }).catch(() => { complete = false; });
    // Let the map draw the last event.
    await page.waitForFunction(() => window.geoshard.map.loaded() && !window.geoshard.map.isMoving(), null, { timeout: 10000 });
    await page.waitForTimeout(300);
    const events = await page.$$eval('#events li[data-id]', (lis) => lis.map((li) => ({
      id: Number(li.dataset.id),
      fence: li.dataset.fence,
      detect: li.dataset.detect,
      OBJECTID: li.dataset.objectid,
      text: li.textContent,
    })));
    const drawn = await page.evaluate(() => {
      const { map } = window.geoshard;
      const names = (layer) => [...new Set(map.queryRenderedFeatures({ layers: [layer] }).map((f) => f.properties.name))].sort();
      return {
        fences: names('fences-fill'),
        outlines: names('fences-line'),
        marks: map.queryRenderedFeatures({ layers: ['fence-marks'] }).map((f) => ({
          color: f.properties.color, coordinates: f.geometry.coordinates,
        })),
        tracks: map.queryRenderedFeatures({ layers: ['fence-tracks'] }).length,
      };
    });
    await page.screenshot({ path: screenshot });
    console.log(JSON.stringify({ state, complete, fences, answers, events, drawn, consoleErrors, failed }));
  } finally {
    await browser.close();
  }
}

main().catch((e) => { console.log(JSON.stringify({ fatal: String((e && e.stack) || e) })); });
