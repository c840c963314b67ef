// Loads a `moeforge report` page in Debian's chromium (headless, through npm playwright-core)
// and checks it the way a reader would: no console errors or page errors, every expected panel
// present with non-empty plots, hover shows a tooltip, a header click sorts. Takes a
// screenshot. Exit 0 when every check passes; each failure is printed on its own line.
// usage: [SCREENSHOT_HEIGHT=px] node report_browser.js REPORT_HTML SCREENSHOT_PNG PANEL[,PANEL...]
//   PANEL: a data-panel id ("summary", "loss", ...) or kind:NAME for data-kind ("kind:usage").
const path = require('path');
const { chromium } = require(path.join(__dirname, '..', 'npm', 'node_modules', 'playwright-core'));

(async () => {
  const [html, png, panels] = process.argv.slice(2);
  const failures = [];
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on('console', (m) => { if (m.type() === 'error') failures.push(`console error: ${m.text()}`); });
    page.on('pageerror', (e) => failures.push(`page error: ${e.message}`));
    page.on('request', (r) => { if (!r.url().startsWith('file:')) failures.push(`network request: ${r.url()}`); });
    await page.goto('file://' + path.resolve(html));
    await page.waitForFunction(() => document.body.dataset.ready === '1', null, { timeout: 20000 })
      .catch(() => failures.push('the page never finished drawing (body[data-ready] unset)'));
    for (const want of panels.split(',').filter((p) => p)) {
      const selector = want.startsWith('kind:') ? `[data-kind="${want.slice(5)}"]` : `[data-panel="${want}"]`;
      const found = await page.$$eval(selector, (els) => els.map((e) => ({
        marks: e.querySelectorAll('svg path, svg rect, svg circle, table td').length,
        empty: e.querySelectorAll('svg .empty').length,
      })));
      if (found.length === 0) failures.push(`panel ${want}: missing`);
      found.forEach((f, i) => {
        if (f.marks === 0) failures.push(`panel ${want} #${i}: no plotted marks`);
        if (f.empty > 0) failures.push(`panel ${want} #${i}: ${f.empty} chart(s) say nothing logged`);
      });
    }
    // SCREENSHOT_HEIGHT: only the top of the page (docs/report.png), else all of it
    const height = Number(process.env.SCREENSHOT_HEIGHT || 0);
    await page.screenshot({ path: png, fullPage: true, ...(height ? { clip: { x: 0, y: 0, width: 1280, height } } : {}) });
    // Hover over the first line chart: the tooltip appears with a value.
    const chart = await page.$('svg.line-chart');
    if (chart) {
      const box = await chart.boundingBox();
      await chart.hover({ position: { x: box.width * 0.6, y: box.height * 0.5 } });
      const tip = await page.$eval('.tip', (t) => (t.style.display === 'block' ? t.textContent : ''));
      if (!/\d/.test(tip)) failures.push(`hover: no tooltip with a value (got "${tip}")`);
      await page.mouse.move(0, 0);
    } else failures.push('no line chart on the page');
    // Sorting: clicking the run-name header twice reverses the order (the page has two runs or more).
    const th = await page.$('[data-panel="summary"] table.sortable th');
    const summaryRows = await page.$$eval('[data-panel="summary"] tbody tr', (r) => r.length);
    if (th && summaryRows > 1) {
      const first = () => page.$eval('[data-panel="summary"] table.sortable td', (td) => td.textContent);
      await th.click();
      const a = await first();
      await th.click();
      const b = await first();
      if (a === b) failures.push(`sorting: the first cell stayed "${a}" after reversing the order`);
    }
  } finally {
    await browser.close();
  }
  for (const f of failures) console.log('FAIL ' + f);
  console.log(failures.length ? `${failures.length} check(s) failed` : 'report: all browser checks passed');
  process.exit(failures.length ? 1 : 0);
})().catch((e) => { console.log('FAIL ' + e.message); process.exit(1); });
