// The flow runtime inside a flow's own QuickJS context: CommonJS `require` over the flow's
// modules, a `dhf` shim for scaffolded main modules, and the runner the host calls.
// Data crosses the boundary as JSON text.
//
// The script's value is the host's object {install, run, compile}; nothing of it is put on
// the global object, so module code cannot reach or replace it. The built-ins the boundary
// relies on are taken before any module runs, so a module that replaces JSON.stringify
// breaks nothing but its own use of it.
(function () {
  "use strict";
  const parseJson = JSON.parse;
  const stringifyJson = JSON.stringify;
  const NewFunction = Function;
  const hasOwn = Object.prototype.hasOwnProperty;
  const keysOf = Object.keys;
  const call = Function.prototype.call.bind(Function.prototype.call);
  const isInteger = Number.isInteger;
  const dateNow = Date.now;
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
  // A thrown value as the host reads it: a status only when it is an HTTP error status.
  function describe(e) {
    if (e && typeof e === "object") {
      const n = Number(e.status || e.statusCode || e.httpStatusCode);
      const status = isInteger(n) && n >= 400 && n <= 599 ? n : null;
      let message;
      try {
        message = e.message !== undefined ? String(e.message) : stringifyJson(e);
      } catch (_) {
        message = "the flow threw an object that cannot be shown";
      }
      return { message: String(message), status: status, name: e.name ? String(e.name) : null };
    }
    return { message: String(e), status: null, name: null };
  }
  function now() {
    return call(dateNow, Date);
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
    for (const t of tries) if (call(hasOwn, flow.sources, t)) return t;
    // An absolute path into the project (`/entities/E/input/F/content.sjs`): match its end.
    for (const t of tries) {
      for (const k of keysOf(flow.sources)) {
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
      const fn = new NewFunction("module", "exports", "require", flow.sources[path] + "\n//# sourceURL=" + path);
      fn(module, module.exports, makeRequire(flow, path));
      return module.exports;
    };
  }

  function install(key, gen, sourcesJson) {
    flows[key] = { gen: gen, sources: parseJson(sourcesJson), cache: {} };
  }

  function firstModule(flow, names) {
    for (const n of names) if (call(hasOwn, flow.sources, n)) return n;
    return null;
  }

  // Run a flow. Returns JSON text: {ok, parts, steps} or {ok: false, error, steps}. Steps
  // (with each plugin's input and output) are serialized only for a trace: when `trace` is
  // set, or when the run fails.
  function run(key, mainPath, id, raw, isJson, optionsJson, trace) {
    const flow = flows[key];
    steps = [];
    captured = null;
    try {
      const options = parseJson(optionsJson);
      const rawContent = isJson ? parseJson(raw) : raw;
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
      return stringifyJson({ ok: true, parts: parts, steps: trace ? steps : [] });
    } catch (e) {
      return stringifyJson({ ok: false, error: describe(e), steps: steps });
    } finally {
      steps = null;
      captured = null;
    }
  }

  // Deploy-time check: compile a module without running it.
  function compile(path, source) {
    try {
      new NewFunction("module", "exports", "require", source);
      return "";
    } catch (e) {
      return path + ": " + (e && e.name ? e.name + ": " : "") + (e && e.message ? e.message : String(e));
    }
  }

  return { install: install, run: run, compile: compile };
})();
