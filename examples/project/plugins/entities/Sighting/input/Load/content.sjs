// The demo's input flow: a sighting as a client sends it ({"species", "lon", "lat"}, numbers
// or numeric text) becomes a feature document with an id and a GeoJSON point; anything
// without a usable position is refused with a 400 naming the document.
function number(v) {
  if (typeof v === 'number') return v;
  if (typeof v === 'string' && v.trim() !== '' && !isNaN(Number(v))) return Number(v);
  return null;
}

function createContent(id, raw, options) {
  const lon = number(raw.lon), lat = number(raw.lat);
  if (lon === null || lat === null || lon < -180 || lon > 180 || lat < -90 || lat > 90) {
    const e = new Error(id + ' has no usable lon and lat');
    e.status = 400;
    throw e;
  }
  const n = number(raw.id);
  return {
    id: n === null ? Math.abs(hash(id)) : n,
    species: String(raw.species || 'unknown'),
    observer: options.observer || null,
    geometry: { type: 'Point', coordinates: [lon, lat] },
  };
}

// A stable integer from the document's URI, for sightings sent without an id.
function hash(s) {
  let h = 0;
  for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
  return h;
}

module.exports = { createContent: createContent };
