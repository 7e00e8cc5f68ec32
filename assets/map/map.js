// The map page: every layer the caller may read, drawn by MapLibre GL JS from this server's
// vector tiles; a click runs a geoQueryService query at that point on each visible layer and
// lists the features it finds. The geofences the caller may see are drawn over them, and the
// events of the fences it follows arrive live (server-sent events) as marks on the map and a
// list. Data is only ever written into the page as text.
import * as maplibregl from '/map/vendor/maplibre-gl.mjs';

const PALETTE = ['#1f6fb4', '#c62828', '#2e7d32', '#7b1fa2', '#ef6c00', '#00838f', '#6d4c41', '#ad1457'];
// Pixels around a click that a query of a point or line layer covers.
const PICK = 5;
// Features a click lists, a layer.
const PICK_LIMIT = 25;

// Fences followed at once: each holds one of the six connections a browser opens to a server.
const MAX_FOLLOW = 3;
// Fences followed when the page opens.
const AUTO_FOLLOW = 2;
// Events kept in the list and on the map.
const EVENTS_KEPT = 200;
const FENCE_COLOR = '#d84315';
const DETECT_COLORS = {
  enter: '#2e7d32', exit: '#c62828', inside: '#1f6fb4', outside: '#7a8794',
  cross: '#ef6c00', near: '#7b1fa2', far: '#6d4c41',
};

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
  // The fences and their events, over every layer: filled from geofences() and events.
  const empty = {type: 'FeatureCollection', features: []};
  style.sources.fences = {type: 'geojson', data: empty, promoteId: 'name'};
  style.sources['fence-events'] = {type: 'geojson', data: empty};
  const hot = ['boolean', ['feature-state', 'hot'], false];
  style.layers.push(
    {id: 'fences-fill', type: 'fill', source: 'fences',
      paint: {'fill-color': FENCE_COLOR, 'fill-opacity': ['case', hot, 0.3, 0.08]}},
    {id: 'fences-line', type: 'line', source: 'fences',
      paint: {'line-color': FENCE_COLOR, 'line-width': ['case', hot, 3.5, 1.8], 'line-dasharray': [3, 2]}},
    {id: 'fence-tracks', type: 'line', source: 'fence-events', filter: ['==', ['get', 'kind'], 'track'],
      paint: {'line-color': ['get', 'color'], 'line-width': 1.5, 'line-opacity': 0.7}},
    {id: 'fence-marks', type: 'circle', source: 'fence-events', filter: ['==', ['get', 'kind'], 'mark'],
      paint: {'circle-color': ['get', 'color'], 'circle-radius': 6,
        'circle-stroke-color': '#ffffff', 'circle-stroke-width': 1.5}},
  );
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

// A polygon of `steps` positions at `radius` metres around [lon, lat], on a sphere: close
// enough to the server's ellipsoidal circle to draw it.
function circle([lon, lat], radius, steps = 64) {
  const R = 6371008.8, d = radius / R, rad = Math.PI / 180;
  const p1 = lat * rad, l1 = lon * rad;
  const ring = [];
  for (let i = 0; i <= steps; i++) {
    const b = (i % steps) / steps * 2 * Math.PI;
    const p2 = Math.asin(Math.sin(p1) * Math.cos(d) + Math.cos(p1) * Math.sin(d) * Math.cos(b));
    const l2 = l1 + Math.atan2(Math.sin(b) * Math.sin(d) * Math.cos(p1), Math.cos(d) - Math.sin(p1) * Math.sin(p2));
    ring.push([l2 / rad, p2 / rad]);
  }
  return {type: 'Polygon', coordinates: [ring]};
}

// A fence's area as GeoJSON, or null for a roaming fence (its area moves with the rows).
function fenceArea(f) {
  if (f.geometry) return f.geometry;
  if (Array.isArray(f.point) && typeof f.radius === 'number') return circle(f.point, f.radius);
  return null;
}

function bboxOf(geometry) {
  let w = Infinity, s = Infinity, e = -Infinity, n = -Infinity;
  const walk = c => {
    if (typeof c[0] === 'number') {
      w = Math.min(w, c[0]); e = Math.max(e, c[0]); s = Math.min(s, c[1]); n = Math.max(n, c[1]);
    } else c.forEach(walk);
  };
  walk(geometry.coordinates);
  return [w, s, e, n];
}

// The fences on services the caller may read; none when it may not list them.
async function geofences() {
  try {
    const body = await getJson('/v1/fences');
    return (body.fences ?? []).sort((a, b) => a.name.localeCompare(b.name));
  } catch {
    return [];
  }
}

function describeFence(f) {
  const detect = (f.detect ?? ['enter', 'exit']).join(', ');
  const what = f.roam ? `within ${f.roam.distance} m of ${f.roam.service}` : `${f.service}.${f.layer}`;
  return `${what} · ${detect}${f.inactive ? ' · inactive' : ''}`;
}

// The live part of the page: the fences drawn and listed, an EventSource per followed fence,
// and its events on the map and in the list, newest first.
class Fences {
  constructor(map, list) {
    this.map = map;
    this.list = list;
    this.sources = new Map();
    this.events = [];
    this.timers = new Map();
    const areas = list.map(f => ({f, area: fenceArea(f)})).filter(x => x.area);
    map.getSource('fences').setData({type: 'FeatureCollection', features: areas.map(({f, area}) => (
      {type: 'Feature', geometry: area, properties: {name: f.name}}))});
    this.render();
  }

  render() {
    const section = document.getElementById('fence-section');
    section.hidden = !this.list.length;
    document.getElementById('event-section').hidden = !this.list.length;
    const ul = document.getElementById('fences');
    ul.replaceChildren();
    this.boxes = new Map();
    for (const f of this.list) {
      const box = el('input', {type: 'checkbox', id: `follow-${f.name}`, title: 'Follow its events'});
      box.addEventListener('change', () => (box.checked ? this.follow(f.name) : this.unfollow(f.name)));
      this.boxes.set(f.name, box);
      const name = el('span', {class: 'fence-name'}, f.name);
      const area = fenceArea(f);
      if (area) name.addEventListener('click', () => this.map.fitBounds(bboxOf(area), {padding: 40, maxZoom: 14}));
      ul.append(el('li', {'data-fence': f.name, 'data-following': 'no'}, box,
        el('span', {class: 'swatch fence'}), el('span', {}, name, el('br'), el('span', {class: 'meta'}, describeFence(f)))));
    }
    this.limit();
  }

  // No more boxes to tick once MAX_FOLLOW fences are followed.
  limit() {
    for (const [name, box] of this.boxes) box.disabled = !box.checked && this.sources.size >= MAX_FOLLOW;
  }

  follow(name) {
    if (this.sources.has(name) || this.sources.size >= MAX_FOLLOW) return;
    const li = document.querySelector(`#fences li[data-fence="${CSS.escape(name)}"]`);
    const source = new EventSource(new URL(`/v1/fences/${encodeURIComponent(name)}/events`, location.origin));
    source.addEventListener('open', () => { li.dataset.following = 'yes'; });
    source.addEventListener('error', () => { li.dataset.following = 'retrying'; });
    source.addEventListener('message', m => {
      try {
        this.add(Number(m.lastEventId), JSON.parse(m.data));
      } catch (e) {
        status.className = 'error';
        status.textContent = `event of ${name}: ${e.message}`;
      }
    });
    this.sources.set(name, source);
    this.boxes.get(name).checked = true;
    this.limit();
  }

  unfollow(name) {
    this.sources.get(name)?.close();
    this.sources.delete(name);
    const li = document.querySelector(`#fences li[data-fence="${CSS.escape(name)}"]`);
    if (li) li.dataset.following = 'no';
    this.limit();
  }

  // Each fence's stream comes in order; the streams of two fences interleave as they arrive,
  // so an event goes in by its id (the commit order), newest first.
  add(id, e) {
    const at = this.events.findIndex(x => x.id < id);
    this.events.splice(at < 0 ? this.events.length : at, 0, {id, ...e});
    this.events.length = Math.min(this.events.length, EVENTS_KEPT);
    const features = [];
    for (const ev of this.events) {
      const color = DETECT_COLORS[ev.detect] ?? '#1d2733';
      if (ev.geometry?.type === 'Point') {
        features.push({type: 'Feature', geometry: ev.geometry, properties: {kind: 'mark', color, id: ev.id}});
        if (ev.previous?.type === 'Point') {
          features.push({type: 'Feature', properties: {kind: 'track', color},
            geometry: {type: 'LineString', coordinates: [ev.previous.coordinates, ev.geometry.coordinates]}});
        }
      }
    }
    this.map.getSource('fence-events').setData({type: 'FeatureCollection', features});
    this.flash(e.fence);
    const ol = document.getElementById('events');
    ol.querySelector('li.muted')?.remove();
    const props = e.properties ?? {};
    const label = props.name ?? props.NAME ?? props.Name ?? '';
    const badge = el('span', {class: 'detect'}, e.detect);
    badge.style.setProperty('--color', DETECT_COLORS[e.detect] ?? '#1d2733');
    const li = el('li', {'data-id': String(id), 'data-fence': e.fence, 'data-detect': e.detect,
      'data-objectid': String(e.OBJECTID ?? '')},
      el('span', {class: 'time'}, new Date(e.time).toLocaleTimeString('en-GB')), badge,
      el('span', {}, `${e.fence}: ${e.OBJECTID ?? ''} ${label}`.trim()));
    const older = [...ol.children].find(x => Number(x.dataset.id) < id);
    ol.insertBefore(li, older ?? null);
    while (ol.children.length > EVENTS_KEPT) ol.lastElementChild.remove();
  }

  // The fence's outline, heavier for a moment after each of its events.
  flash(name) {
    this.map.setFeatureState({source: 'fences', id: name}, {hot: true});
    clearTimeout(this.timers.get(name));
    this.timers.set(name, setTimeout(() => this.map.setFeatureState({source: 'fences', id: name}, {hot: false}), 1500));
  }
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
  const [list, fenceList] = await Promise.all([readableLayers(), geofences()]);
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
  layerList(map, list);
  const ready = new Promise(resolve => map.once('load', resolve));
  window.geoshard = {map, layers: list};
  await ready;
  const fences = new Fences(map, fenceList);
  for (const f of fenceList.slice(0, AUTO_FOLLOW)) fences.follow(f.name);
  window.geoshard.fences = fences;
  map.once('idle', () => { document.body.dataset.state = 'ready'; });
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
