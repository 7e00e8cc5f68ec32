// The map page: every layer the caller may read, drawn by MapLibre GL JS from this server's
// vector tiles; a click runs a geoQueryService query at that point on each visible layer and
// lists the features it finds. Data is only ever written into the page as text.
import * as maplibregl from '/map/vendor/maplibre-gl.mjs';

const PALETTE = ['#1f6fb4', '#c62828', '#2e7d32', '#7b1fa2', '#ef6c00', '#00838f', '#6d4c41', '#ad1457'];
// Pixels around a click that a query of a point or line layer covers.
const PICK = 5;
// Features a click lists, a layer.
const PICK_LIMIT = 25;

const panel = document.getElementById('properties');
const status = document.getElementById('status');

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

// Every request's URL is built from location.origin: a page opened at
// http://user:password@host/ resolves relative URLs with those credentials, and fetch refuses
// such URLs.
async function getJson(url, init) {
  const r = await fetch(new URL(url, location.origin), init);
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new Error(body?.errorResponse?.message ?? `${url} answered ${r.status}`);
  return body;
}

function geoQuery(l, query) {
  return getJson('/v1/resources/geoQueryService', {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({params: {id: l.service, layer: l.layer, method: 'query'}, query}),
  });
}

// The layers the caller may read: their names and geometry types from modelService, their
// extents from the OGC collections.
async function readableLayers() {
  const [models, ogc] = await Promise.all([
    getJson('/v1/resources/modelService'),
    getJson('/ogc/collections'),
  ]);
  const extents = new Map(ogc.collections.map(c => [c.id, c.extent?.spatial?.bbox?.[0]]));
  const list = [];
  for (const model of Object.values(models.models ?? {})) {
    for (const l of model.layers ?? []) {
      const id = `${model.id}.${l.id}`;
      list.push({
        id,
        service: model.id,
        layer: l.id,
        title: l.name || id,
        geometryType: String(l.geometryType ?? ''),
        bbox: extents.get(id),
      });
    }
  }
  list.sort((a, b) => a.id.localeCompare(b.id));
  list.forEach((l, i) => {
    l.color = PALETTE[i % PALETTE.length];
    l.source = `layer-${i}`;
    l.visible = true;
  });
  return list;
}

const isPolygon = ['match', ['geometry-type'], ['Polygon', 'MultiPolygon'], true, false];
const isLine = ['match', ['geometry-type'], ['LineString', 'MultiLineString', 'Polygon', 'MultiPolygon'], true, false];
const isPoint = ['match', ['geometry-type'], ['Point', 'MultiPoint'], true, false];

// A style of the layers: all fills under all lines under all points.
function styleOf(list) {
  const style = {
    version: 8,
    // The base: the world's countries, served by this server from its bundled data.
    sources: {base: {
      type: 'vector',
      tiles: [`${location.origin}/map/base/{z}/{x}/{y}.mvt`],
      maxzoom: 8,
    }},
    layers: [
      {id: 'background', type: 'background', paint: {'background-color': '#dbe7f0'}},
      {id: 'base-land', type: 'fill', source: 'base', 'source-layer': 'countries',
        paint: {'fill-color': '#f6f4ef'}},
      {id: 'base-border', type: 'line', source: 'base', 'source-layer': 'countries',
        paint: {'line-color': '#b9b2a6', 'line-width': 0.6}},
    ],
  };
  const fills = [], lines = [], points = [];
  for (const l of list) {
    const source = {
      type: 'vector',
      tiles: [`${location.origin}/tiles/${encodeURIComponent(l.id)}/{z}/{x}/{y}.mvt`],
      maxzoom: 16,
    };
    if (l.bbox) source.bounds = clampBounds(l.bbox);
    style.sources[l.source] = source;
    const common = {source: l.source, 'source-layer': l.id};
    // Styled by geometry type: polygons filled and outlined, lines drawn heavier than
    // outlines, points as circles.
    fills.push({id: `${l.source}-fill`, type: 'fill', ...common, filter: isPolygon,
      paint: {'fill-color': l.color, 'fill-opacity': 0.22}});
    lines.push({id: `${l.source}-line`, type: 'line', ...common, filter: isLine,
      layout: {'line-cap': 'round', 'line-join': 'round'},
      paint: {
        'line-color': l.color,
        // A zoom expression must be the outermost: the kind is chosen at each stop.
        'line-width': ['interpolate', ['linear'], ['zoom'],
          0, ['match', ['geometry-type'], ['LineString', 'MultiLineString'], 1.2, 0.8],
          12, ['match', ['geometry-type'], ['LineString', 'MultiLineString'], 3, 0.8]],
      }});
    points.push({id: `${l.source}-point`, type: 'circle', ...common, filter: isPoint,
      paint: {
        'circle-color': l.color,
        'circle-radius': ['interpolate', ['linear'], ['zoom'], 0, 1.2, 8, 2.5, 14, 5],
        'circle-stroke-color': '#ffffff',
        'circle-stroke-width': ['interpolate', ['linear'], ['zoom'], 0, 0, 8, 0.5],
      }});
  }
  style.layers.push(...fills, ...lines, ...points);
  return style;
}

function clampBounds([w, s, e, n]) {
  const lat = v => Math.max(-85.0511, Math.min(85.0511, v));
  const lon = v => Math.max(-180, Math.min(180, v));
  return [lon(w), lat(s), lon(e), lat(n)];
}

function union(list) {
  const boxes = list.map(l => l.bbox).filter(Boolean);
  if (!boxes.length) return null;
  return clampBounds([
    Math.min(...boxes.map(b => b[0])), Math.min(...boxes.map(b => b[1])),
    Math.max(...boxes.map(b => b[2])), Math.max(...boxes.map(b => b[3])),
  ]);
}

// The kind of geometry a layer's descriptor declares, for its legend's symbol.
function kindOf(geometryType) {
  if (/point/i.test(geometryType)) return 'point';
  if (/line/i.test(geometryType)) return 'line';
  if (/polygon/i.test(geometryType)) return 'polygon';
  return 'mixed';
}

// The layer list is the legend: a symbol of each layer's colour and kind of geometry, and the
// base layer last.
function layerList(map, list) {
  const ul = document.getElementById('layers');
  ul.replaceChildren();
  if (!list.length) ul.append(el('li', {class: 'muted'}, 'No layer you may read.'));
  for (const l of list) {
    const box = el('input', {type: 'checkbox', id: `show-${l.source}`});
    box.checked = true;
    box.addEventListener('change', () => {
      l.visible = box.checked;
      for (const kind of ['fill', 'line', 'point']) {
        map.setLayoutProperty(`${l.source}-${kind}`, 'visibility', l.visible ? 'visible' : 'none');
      }
    });
    const count = el('span', {class: 'count'}, '…');
    const kind = kindOf(l.geometryType);
    const swatch = el('span', {class: `swatch ${kind}`, title: kind});
    swatch.style.setProperty('--color', l.color);
    ul.append(el('li', {'data-layer': l.id, 'data-kind': kind}, box, swatch,
      el('label', {for: box.id}, l.title), count));
    geoQuery(l, {returnCountOnly: true})
      .then(r => { count.textContent = Number(r.count).toLocaleString('en-US'); })
      .catch(e => { count.textContent = '?'; count.title = e.message; });
  }
  const base = el('input', {type: 'checkbox', id: 'show-base'});
  base.checked = true;
  base.addEventListener('change', () => {
    for (const id of ['base-land', 'base-border']) {
      map.setLayoutProperty(id, 'visibility', base.checked ? 'visible' : 'none');
    }
  });
  ul.append(el('li', {'data-layer': 'base', class: 'base'}, base, el('span', {class: 'swatch base'}),
    el('label', {for: base.id}, 'Countries (base map)')));
}

// The query geometry of a click on a layer: the point itself for polygons (point in polygon),
// a box of a few pixels around it for points and lines.
function pickGeometry(map, l, e) {
  if (/polygon/i.test(l.geometryType)) {
    return {type: 'Point', coordinates: [e.lngLat.lng, e.lngLat.lat]};
  }
  const a = map.unproject([e.point.x - PICK, e.point.y + PICK]);
  const b = map.unproject([e.point.x + PICK, e.point.y - PICK]);
  return {type: 'Polygon', coordinates: [[
    [a.lng, a.lat], [b.lng, a.lat], [b.lng, b.lat], [a.lng, b.lat], [a.lng, a.lat],
  ]]};
}

function featureCard(l, f) {
  const props = f.properties ?? f.attributes ?? {};
  const rows = Object.entries(props).map(([k, v]) =>
    el('tr', {}, el('td', {}, k), el('td', {}, v === null ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v))));
  const title = props.name ?? props.NAME ?? props.Name ?? f.id ?? '';
  return el('div', {class: 'feature', 'data-layer': l.id},
    el('h3', {}, `${l.title}: ${title}`), el('table', {}, el('tbody', {}, ...rows)));
}

let marker = null;

async function pick(map, list, e) {
  const visible = list.filter(l => l.visible);
  marker ??= new maplibregl.Marker({color: '#1d2733', scale: 0.6});
  marker.setLngLat(e.lngLat).addTo(map);
  panel.className = 'muted';
  panel.replaceChildren(`Querying ${visible.length} layer${visible.length === 1 ? '' : 's'} at ` +
    `${e.lngLat.lng.toFixed(5)}, ${e.lngLat.lat.toFixed(5)}…`);
  const geometries = Object.fromEntries(visible.map(l => [l.id, pickGeometry(map, l, e)]));
  // What was asked, for whoever reads the page (a test's oracle).
  panel.dataset.query = JSON.stringify(geometries);
  const answers = await Promise.all(visible.map(l =>
    geoQuery(l, {
      outFields: '*',
      returnGeometry: false,
      resultRecordCount: PICK_LIMIT,
      extension: {geometry: geometries[l.id]},
    }).then(r => ({l, features: r.features ?? []}), error => ({l, error}))));
  panel.className = '';
  const cards = [];
  for (const {l, features, error} of answers) {
    if (error) cards.push(el('p', {class: 'error'}, `${l.title}: ${error.message}`));
    else for (const f of features) cards.push(featureCard(l, f));
  }
  if (!cards.length) cards.push(el('p', {class: 'muted'}, 'No feature here.'));
  panel.replaceChildren(...cards);
  panel.dataset.state = 'answered';
}

async function main() {
  const list = await readableLayers();
  const map = new maplibregl.Map({
    container: 'map',
    style: styleOf(list),
    hash: true,
    bounds: location.hash ? undefined : union(list) ?? undefined,
    fitBoundsOptions: {padding: 20},
    attributionControl: false,
    // Keeps the drawn frame readable (a screenshot, a test reading the canvas).
    canvasContextAttributes: {preserveDrawingBuffer: true},
  });
  map.addControl(new maplibregl.NavigationControl({showCompass: false}));
  map.addControl(new maplibregl.ScaleControl());
  map.getCanvas().style.cursor = 'crosshair';
  map.on('error', e => {
    status.className = 'error';
    status.textContent = e.error?.message ?? String(e.error ?? e);
  });
  map.on('click', e => pick(map, list, e).catch(err => {
    panel.className = 'error';
    panel.textContent = err.message;
  }));
  map.once('idle', () => { document.body.dataset.state = 'ready'; });
  layerList(map, list);
  window.geoshard = {map, layers: list};
}

// A page opened at http://user:password@host/ is opened again without them (the browser keeps
// them for the site): the map's address bar updates and fetch both refuse such URLs. Chromium
// hides them from location.href; document.URL has them.
const here = new URL(document.URL);
if (here.username || here.password) {
  const clean = here;
  clean.username = '';
  clean.password = '';
  location.replace(clean.href);
} else main().catch(e => {
  status.className = 'error';
  status.textContent = e.message;
  document.body.dataset.state = 'failed';
});
