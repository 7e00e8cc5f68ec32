// The cluster page: which node holds which shard, from GET /v1/cluster (admin only), every
// 2 s. A table of nodes (state, lag, shards) and a table of shards by node: S where the node
// serves the shard, C where it holds it and is catching up. Data is written as text only.
const REFRESH_MS = 2000;

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

function row(cells, head = false) {
  return el('tr', {}, ...cells.map(c => el(head ? 'th' : 'td', typeof c === 'object' ? c.attrs : {}, typeof c === 'object' ? c.text : String(c))));
}

function render(c) {
  document.getElementById('name').textContent = c.cluster;
  const shards = c.shards;
  const nodes = document.getElementById('nodes');
  nodes.replaceChildren(row(['node', 'http', 'state', 'applied', 'lag', 'shards'], true),
    ...c.nodes.map(n => row([n.node, n.http || '-', n.state, n.applied, n.lag, n.shards ? n.shards.join(', ') : 'all'])));
  const table = document.getElementById('shards');
  if (!shards) {
    table.replaceChildren(row(['every node holds every row'], true));
  } else {
    const names = c.nodes.map(n => n.node);
    const under = new Set(shards.under_replicated);
    table.replaceChildren(row(['shard', ...names, 'serving'], true),
      ...shards.holders.map(h => {
        const mark = name => h.serving.includes(name) ? {text: 'S', attrs: {class: 'held'}}
          : h.catching_up.includes(name) ? {text: 'C', attrs: {class: 'catching'}} : '';
        const count = {text: `${h.serving.length}/${shards.replicas}`, attrs: {class: under.has(h.shard) ? 'error' : ''}};
        return row([h.shard, ...names.map(mark), count]);
      }));
  }
  const problems = shards
    ? `${shards.under_replicated.length} under-replicated, ${shards.unheld.length} unheld of ${shards.holders.length} shards (${shards.partition})`
    : 'no shards: every node holds every row';
  document.getElementById('summary').textContent =
    `${c.nodes.length} live nodes, log entry ${c.log_last}, messages ${c.signed ? 'signed' : 'NOT signed (no cluster_secret)'}; ${problems}`;
}

async function refresh() {
  try {
    const r = await fetch(new URL('/v1/cluster', location.origin));
    const body = await r.json().catch(() => null);
    if (!r.ok) throw new Error(body?.errorResponse?.message ?? `/v1/cluster answered ${r.status}`);
    render(body);
    document.body.dataset.state = 'ready';
  } catch (e) {
    const s = document.getElementById('summary');
    s.textContent = e.message;
    s.className = 'error';
    document.body.dataset.state = 'failed';
    return;
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();
