// Reads the native FeatureServer's f=pbf answers with code that is not geoshard's, for
// tests/it/arcgis.rs: arcgis-pbf-parser (npm) for feature results, and the pbf package it
// uses for count and id results.
//
//   node pbf_decode.js URL...
//
// Prints one JSON line: for each URL, {kind: "features", featureCollection,
// exceededTransferLimit}, {kind: "count", count} or {kind: "ids", name, ids}.

const decode = require('arcgis-pbf-parser');
const Pbf = require('pbf');

// FeatureCollectionPBuffer: 2 = queryResult; QueryResult: 1 = featureResult,
// 2 = countResult (1 = count), 3 = idsResult (1 = objectIdFieldName, 3 = objectIds).
function kindOf(buf) {
  const top = new Pbf(buf).readFields((tag, obj, pbf) => {
    if (tag !== 2) return;
    pbf.readMessage((t, q, p) => {
      if (t === 1) q.kind = 'features';
      else if (t === 2) {
        q.kind = 'count';
        q.count = p.readMessage((u, c, r) => { if (u === 1) c.count = r.readVarint(); }, { count: 0 }).count;
      } else if (t === 3) {
        q.kind = 'ids';
        const ids = p.readMessage((u, c, r) => {
          if (u === 1) c.name = r.readString();
          else if (u === 3) r.readPackedVarint(c.ids);
        }, { ids: [] });
        q.name = ids.name;
        q.ids = ids.ids;
      }
    }, obj);
  }, {});
  return top;
}

async function main() {
  const out = [];
  for (const url of process.argv.slice(2)) {
    const r = await fetch(url);
    const type = r.headers.get('content-type');
    if (r.status !== 200 || type !== 'application/x-protobuf') {
      throw new Error(`${url}: ${r.status} ${type} ${await r.text()}`);
    }
    const buf = new Uint8Array(await r.arrayBuffer());
    const head = kindOf(buf);
    if (head.kind === 'features') {
      const d = decode(buf);
      out.push({ kind: 'features', featureCollection: d.featureCollection,
        exceededTransferLimit: !!d.exceededTransferLimit });
    } else {
      out.push(head);
    }
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
