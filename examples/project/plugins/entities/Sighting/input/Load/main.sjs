// The flow's main module: the content plugin's document in an envelope with no headers or
// triples.
const dhf = require('/data-hub/4/dhf.sjs');
const contentPlugin = require('./content.sjs');

function main(id, rawContent, options) {
  const content = contentPlugin.createContent(id, rawContent, options);
  return dhf.makeEnvelope(content, {}, [], options.dataFormat);
}

module.exports = { main: main };
