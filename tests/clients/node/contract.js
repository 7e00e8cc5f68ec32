// The official Node.js client (marklogic 3.7.1) through the calls its users make: single and
// bulk writes with and without a flow transform, multi-document and multi-category reads,
// probe, permissions, modelService and a point-in-polygon geoQueryService query. Prints what
// it got as one JSON line; tests/clients.rs checks it against answers of its own.
'use strict';
const marklogic = require('marklogic');

const [host, port, user, password, lon, lat] = process.argv.slice(2);
const db = marklogic.createDatabaseClient({
  host, port: Number(port), user, password, authType: 'DIGEST',
});

const flow = ['svc:sjsInputFlow', { 'entity-name': 'Mollusk', 'flow-name': 'LoadJson' }];
const readers = [
  { 'role-name': 'rest-reader', capabilities: ['read'] },
  { 'role-name': 'rest-writer', capabilities: ['update'] },
];

async function step(out, name, f) {
  try {
    out[name] = await f();
  } catch (e) {
    out[name] = { error: e.statusCode || String(e.message || e) };
  }
}

async function main() {
  const out = {};
  await step(out, 'single', async () => {
    const r = await db.documents.write({
      uri: '/node/single.json', contentType: 'application/json', content: { n: 1 },
      collections: ['node'], permissions: readers,
    }).result();
    return r.documents.map((d) => d.uri);
  });
  await step(out, 'bulk', async () => {
    const r = await db.documents.write([
      { uri: '/node/b1.json', contentType: 'application/json', content: { n: 2 }, collections: ['node'] },
      { uri: '/node/b2.json', contentType: 'application/json', content: { n: 3 }, collections: ['node'] },
    ]).result();
    return r.documents.map((d) => d.uri);
  });
  await step(out, 'single_flow', async () => {
    const r = await db.documents.write({
      uri: '/node/m1.json', contentType: 'application/json',
      content: { id: '1', X: '-70.5', Y: '41.25' }, transform: flow,
    }).result();
    return r.documents.map((d) => d.uri);
  });
  await step(out, 'bulk_flow', async () => {
    const r = await db.documents.write({
      documents: [
        { uri: '/node/m2.json', contentType: 'application/json', content: { id: '2', X: '-71', Y: '42' } },
        { uri: '/node/m3.json', contentType: 'application/json', content: { id: '3', X: '-72.5', Y: '43' } },
      ],
      transform: flow,
    }).result();
    return r.documents.map((d) => d.uri);
  });
  await step(out, 'read_many', async () => {
    const docs = await db.documents.read(['/node/b1.json', '/node/m2.json', '/node/absent.json']).result();
    return docs.map((d) => ({ uri: d.uri, content: d.content }));
  });
  await step(out, 'read_categories', async () => {
    const docs = await db.documents.read({
      uris: ['/node/single.json', '/node/m3.json'], categories: ['content', 'metadata'],
    }).result();
    return docs.map((d) => ({
      uri: d.uri, content: d.content, collections: d.collections, permissions: d.permissions,
    }));
  });
  await step(out, 'probe', async () => {
    const yes = await db.documents.probe('/node/single.json').result();
    const no = await db.documents.probe('/node/absent.json').result();
    return [yes.exists, no.exists];
  });
  await step(out, 'models', async () => {
    const r = await db.resources.get({ name: 'modelService' }).result();
    return Object.keys(r.models || {}).sort();
  });
  await step(out, 'pip', async () => {
    const r = await db.resources.post({
      name: 'geoQueryService',
      params: {},
      documents: {
        params: { id: 'Counties', layer: 0, method: 'query' },
        query: {
          returnGeometry: false, outFields: '*', spatialRel: 'esriSpatialRelContains',
          geometryType: 'esriGeometryPoint',
          extension: { geometry: { type: 'Point', coordinates: [Number(lon), Number(lat)] } },
        },
      },
    }).result();
    return r.features.map((f) => f.properties.OBJECTID);
  });
  console.log(JSON.stringify(out));
  db.release();
}

main().catch((e) => { console.log(JSON.stringify({ fatal: String(e && e.stack || e) })); });
