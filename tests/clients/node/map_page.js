// The map page in a real browser: Debian's Chromium (headless, WebGL on SwiftShader) driven by
// playwright-core. Opens the page at a view, waits for the tiles to be drawn, clicks at a
// point, waits for the properties panel's answer and saves a screenshot. Prints a JSON summary
// of what it saw; the Rust test decides what is right.
'use strict';
const { openBrowser } = require('./browser');

const [url, user, password, view, lon, lat, screenshot, executable] = process.argv.slice(2);

async function main() {
  const { browser, context, page, consoleErrors, failed } = await openBrowser(user, password, executable);
  try {
    // Every answer by status (the 401 challenges before credentials are sent are expected).
    const statuses = {};
    let tiles = 0;
    let baseTiles = 0;
    context.on('response', (r) => {
      statuses[r.status()] = (statuses[r.status()] || 0) + 1;
      if (r.status() === 200 && r.url().includes('/tiles/')) tiles += 1;
      if (r.status() === 200 && r.url().includes('/map/base/')) baseTiles += 1;
    });

    // First the page as a user opens it (every layer in view), then the view asked for.
    const drawnAll = () => page.waitForFunction(
      () => window.geoshard.map.loaded() && window.geoshard.map.areTilesLoaded(), null, { timeout: 60000 });
    await page.goto(`${url}/`);
    await page.waitForFunction(() => ['ready', 'failed'].includes(document.body.dataset.state),
      null, { timeout: 60000 });
    const state = await page.evaluate(() => document.body.dataset.state);
    const status = await page.textContent('#status');
    if (state !== 'ready') {
      console.log(JSON.stringify({ state, status, consoleErrors, failed }));
      return;
    }
    await drawnAll();
    await page.screenshot({ path: screenshot.replace(/\.png$/, '-overview.png') });
    const [zoom, lat0, lon0] = view.split('/').map(Number);
    await page.evaluate(([z, x, y]) => window.geoshard.map.jumpTo({ zoom: z, center: [x, y] }), [zoom, lon0, lat0]);
    await page.waitForFunction(() => !window.geoshard.map.isMoving(), null, { timeout: 10000 });
    await drawnAll();
    await page.waitForFunction(
      () => [...document.querySelectorAll('#layers .count')].every((c) => c.textContent !== '…'),
      null, { timeout: 30000 });
    const layers = await page.$$eval('#layers li', (lis) => lis.map((li) => ({
      id: li.dataset.layer,
      kind: li.dataset.kind || null,
      swatch: li.querySelector('.swatch') && li.querySelector('.swatch').className,
      title: li.querySelector('label') && li.querySelector('label').textContent,
      count: li.querySelector('.count') && li.querySelector('.count').textContent,
    })));

    // What was drawn: the features rendered by source layer, and the canvas's pixels that are
    // not the background.
    const drawn = await page.evaluate(() => {
      const { map } = window.geoshard;
      const rendered = {};
      for (const f of map.queryRenderedFeatures()) {
        rendered[f.sourceLayer] = (rendered[f.sourceLayer] || 0) + 1;
      }
      const canvas = map.getCanvas();
      const copy = document.createElement('canvas');
      copy.width = canvas.width;
      copy.height = canvas.height;
      const ctx = copy.getContext('2d');
      ctx.drawImage(canvas, 0, 0);
      const px = ctx.getImageData(0, 0, copy.width, copy.height).data;
      // Pixels of the water (the background), of bare land (the base layer) and the rest,
      // which the layers painted.
      let painted = 0;
      let water = 0;
      let land = 0;
      const colors = new Set();
      const near = (i, r, g, b) => Math.abs(px[i] - r) + Math.abs(px[i + 1] - g) + Math.abs(px[i + 2] - b) <= 24;
      for (let i = 0; i < px.length; i += 4) {
        if (near(i, 0xdb, 0xe7, 0xf0)) water += 1;
        else if (near(i, 0xf6, 0xf4, 0xef)) land += 1;
        else painted += 1;
        colors.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
      }
      return { rendered, pixels: px.length / 4, painted, water, land, colors: colors.size };
    });

    // Click where the point is on screen.
    const at = await page.evaluate(([x, y]) => {
      const p = window.geoshard.map.project([x, y]);
      return { x: p.x, y: p.y };
    }, [Number(lon), Number(lat)]);
    const box = await page.locator('#map').boundingBox();
    await page.mouse.click(box.x + at.x, box.y + at.y);
    await page.waitForFunction(() => document.getElementById('properties').dataset.state === 'answered',
      null, { timeout: 30000 });
    const clicked = await page.evaluate(() => JSON.parse(document.getElementById('properties').dataset.query));
    const cards = await page.$$eval('#properties .feature', (ds) => ds.map((d) => ({
      layer: d.dataset.layer,
      title: d.querySelector('h3').textContent,
      properties: Object.fromEntries([...d.querySelectorAll('tr')].map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent])),
    })));
    const panel = await page.textContent('#properties');
    await page.screenshot({ path: screenshot });
    console.log(JSON.stringify({ state, status, layers, drawn, tiles, baseTiles, clicked, cards, panel, consoleErrors, failed, statuses }));
  } finally {
    await browser.close();
  }
}

main().catch((e) => { console.log(JSON.stringify({ fatal: String((e && e.stack) || e) })); });
