// The flow runtime inside each pooled QuickJS context: CommonJS `require` over a flow's own
// modules, a `dhf` shim for scaffolded main modules, and the runner the host calls.
// Data crosses the boundary as JSON text.
(function () {
  "use strict";
  const flows = {}; // key -> { gen, sources: {path: text}, cache: {path: module} }
  let steps = null; // the current run's step records
  let captured = null; // an envelope handed to dhf.runWriter

  function norm(path) {
    const out = [];
    for (const p of path.split("/")) {
      if (p === "" || p === ".") continue;
      if (p === "..") out.pop();
      else out.push(p);
    }
    return out.join("/");
  }
  function dirname(p) {
    const i = p.lastIndexOf("/");
    return i < 0 ? "" : p.slice(0, i);
  }
  function describe(e) {
    if (e && typeof e === "object") {
      const status = Number(e.status || e.statusCode || e.httpStatusCode) || null;
      const message = e.message !== undefined ? String(e.message) : JSON.stringify(e);
      return { message: message, status: status, name: e.name || null };
    }
    return { message: String(e), status: null, name: null };
  }
  function now() {
    return Date.now();
  }
  function step(label, input, fn) {
    const t0 = now();
    try {
      const out = fn();
      if (steps) steps.push({ label: label, input: input, output: out === undefined ? null : out, error: null, duration: now() - t0 });
      return out;
    } catch (e) {
      if (steps) steps.push({ label: label, input: input, output: null, error: describe(e), duration: now() - t0 });
      throw e;
    }
  }

  // The part of the data hub library that scaffolded main modules use.
  const dhf = {
    contentContext: function (raw) { return { label: "content", input: raw }; },
    headersContext: function (content) { return { label: "headers", input: content }; },
    triplesContext: function (content, headers) { return { label: "triples", input: { content: content, headers: headers } }; },
    writerContext: function (envelope) { return { label: "writer", input: envelope }; },
    run: function (ctx, fn) { return step((ctx && ctx.label) || "step", ctx ? ctx.input : null, fn); },
    makeEnvelope: function (content, headers, triples, dataFormat) {
      return { $envelopeParts: { content: content, headers: headers, triples: triples, dataFormat: dataFormat } };
    },
    makeLegacyEnvelope: function (content, headers, triples, dataFormat) {
      return dhf.makeEnvelope(content, headers, triples, dataFormat);
    },
    runWriter: function (writer, id, envelope, options) {
      captured = envelope;
      if (writer && typeof writer.write === "function") {
        step("writer", envelope, function () { return writer.write(id, envelope, options); });
      }
    },
    logTrace: function () {},
    logError: function () {},
  };

  function resolve(flow, from, spec) {
    if (spec === "/data-hub/4/dhf.sjs" || spec === "dhf" || /\/dhf\.sjs$/.test(spec)) return "dhf";
    const base = spec.startsWith("/") ? norm(spec) : norm(dirname(from) + "/" + spec);
    const tries = [base, base + ".sjs", base + ".js"];
    for (const t of tries) if (Object.prototype.hasOwnProperty.call(flow.sources, t)) return t;
    // An absolute path into the project (`/entities/E/input/F/content.sjs`): match its end.
    for (const t of tries) {
      for (const k of Object.keys(flow.sources)) {
        if (t.endsWith("/" + k)) return k;
      }
    }
    return null;
  }

  function makeRequire(flow, from) {
    return function require(spec) {
      const path = resolve(flow, from, String(spec));
      if (path === "dhf") return dhf;
      if (path === null) throw new Error("module not found: " + spec + " (required from " + from + ")");
      if (flow.cache[path]) return flow.cache[path].exports;
      const module = { exports: {}, id: path };
      flow.cache[path] = module;
      const fn = new Function("module", "exports", "require", flow.sources[path] + "\n//# sourceURL=" + path);
      fn(module, module.exports, makeRequire(flow, path));
      return module.exports;
    };
  }

  globalThis.__installFlow = function (key, gen, sourcesJson) {
    flows[key] = { gen: gen, sources: JSON.parse(sourcesJson), cache: {} };
  };

  function firstModule(flow, names) {
    for (const n of names) if (Object.prototype.hasOwnProperty.call(flow.sources, n)) return n;
    return null;
  }

  // Run a flow. Returns JSON text: {ok, parts, steps} or {ok: false, error, steps}. Steps
  // (with each plugin's input and output) are serialized only for a trace: when `trace` is
  // set, or when the run fails.
  globalThis.__runFlow = function (key, mainPath, id, raw, isJson, optionsJson, trace) {
    const flow = flows[key];
    steps = [];
    captured = null;
    try {
      const options = JSON.parse(optionsJson);
      const rawContent = isJson ? JSON.parse(raw) : raw;
      const require = makeRequire(flow, mainPath);
      const main = require("./" + mainPath.split("/").pop());
      let result;
      if (main && typeof main.main === "function") {
        result = main.main(id, rawContent, options);
        if (captured !== null) result = captured;
      } else {
        // No main function: run the plugins in order, defaults where a plugin is absent.
        const plugin = function (name) {
          const p = firstModule(flow, [name + ".sjs", name + "/" + name + ".sjs", name + ".js"]);
          return p === null ? null : require("./" + p);
        };
        const c = plugin("content"), h = plugin("headers"), t = plugin("triples");
        const content = step("content", rawContent, function () {
          return c && c.createContent ? c.createContent(id, rawContent, options) : rawContent;
        });
        const headers = step("headers", content, function () {
          return h && h.createHeaders ? h.createHeaders(id, content, options) : {};
        });
        const triples = step("triples", { content: content, headers: headers }, function () {
          return t && t.createTriples ? t.createTriples(id, content, headers, options) : [];
        });
        result = dhf.makeEnvelope(content, headers, triples, options.dataFormat);
      }
      let parts;
      if (result && result.$envelopeParts) parts = result.$envelopeParts;
      else if (result && result.envelope) parts = { envelope: result.envelope };
      else parts = { content: result, headers: {}, triples: [] };
      if (parts.headers === undefined || parts.headers === null) parts.headers = {};
      if (parts.triples === undefined || parts.triples === null) parts.triples = [];
      if (parts.content === undefined) parts.content = null;
      return JSON.stringify({ ok: true, parts: parts, steps: trace ? steps : [] });
    } catch (e) {
      return JSON.stringify({ ok: false, error: describe(e), steps: steps });
    } finally {
      steps = null;
      captured = null;
    }
  };

  // Deploy-time check: compile a module without running it.
  globalThis.__compile = function (path, source) {
    try {
      new Function("module", "exports", "require", source);
      return "";
    } catch (e) {
      return path + ": " + (e && e.name ? e.name + ": " : "") + (e && e.message ? e.message : String(e));
    }
  };
})();
