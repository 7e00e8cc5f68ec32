// Debian's Chromium through playwright-core, as the page tests open it: headless, WebGL on
// SwiftShader, the user's credentials answering the server's challenges, and every console
// error and failed answer (but the 401 challenges) recorded for the Rust test to check.
'use strict';
const { chromium } = require('playwright-core');

async function openBrowser(user, password, executable, viewport = { width: 1200, height: 800 }) {
  const browser = await chromium.launch({
    executablePath: executable || '/usr/bin/chromium',
    args: ['--no-sandbox', '--use-angle=swiftshader', '--enable-unsafe-swiftshader', '--ignore-gpu-blocklist'],
  });
  const context = await browser.newContext({ httpCredentials: { username: user, password }, viewport });
  const page = await context.newPage();
  const consoleErrors = [];
  const failed = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  context.on('response', (r) => {
    if (r.status() >= 400 && r.status() !== 401) failed.push(`${r.status()} ${r.url()}`);
  });
  return { browser, context, page, consoleErrors, failed };
}

module.exports = { openBrowser };
