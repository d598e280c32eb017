// @NAME@: a kiln operand plugin in JavaScript (`kiln:operand@0.2.0`, `wit/operand.wit`).
//
// It adds the labels its settings name to every object of the state:
//
//   kiln.dev/plugins: |
//     device-plugin:
//       then:
//         - name: @NAME@
//           settings: {labels: {team: gpu}}
//
// Edit `transform` (and `validateSettings`) to do what your site needs; `cases/` holds the case
// files `kiln plugin test @NAME@.wasm cases` runs. The plugin runs in kiln's virtual WASI: no
// files, no network (`fetch` fails), a fixed clock and randomness seeded from its inputs, so
// the same inputs always give the same result.

// The world's `log` import: log(level, message), level 'debug' | 'info' | 'warn'.
import log from 'log';

// The name the plugin is installed and named by (`@NAME@.wasm`).
const NAME = '@NAME@';

// The settings' `labels` (a map of strings; empty when the settings are `null`), or the
// refused fields.
function labels(settings) {
  let value;
  try {
    value = JSON.parse(settings);
  } catch (e) {
    return [null, [{ path: '', message: String(e) }]];
  }
  const found = value !== null && typeof value === 'object' ? value.labels : undefined;
  if (found === undefined || found === null) return [{}, null];
  if (typeof found !== 'object' || Array.isArray(found)) {
    return [null, [{ path: 'labels', message: `expected a map, got ${JSON.stringify(found)}` }]];
  }
  for (const [key, v] of Object.entries(found)) {
    if (typeof v !== 'string') {
      return [null, [{ path: `labels.${key}`, message: `expected a string, got ${JSON.stringify(v)}` }]];
    }
  }
  return [found, null];
}

export function name() {
  return NAME;
}

// Throwing returns the error case of the WIT `result`.
export function validateSettings(plugin, settings) {
  const [, errors] = labels(settings);
  if (errors) throw errors;
}

export function transform(objects, spec, settings, ctx) {
  const [found, errors] = labels(settings);
  if (errors) {
    const [e] = errors;
    throw { tag: 'invalid-field', val: { path: `settings.${e.path}`, message: e.message } };
  }
  log('info', `${objects.length} objects of state ${ctx.state}`);
  const entries = Object.entries(found);
  return objects.map((text) => {
    const object = JSON.parse(text);
    const ops = [];
    if (!(object.metadata && 'labels' in object.metadata) && entries.length > 0) {
      ops.push({ op: 'add', path: '/metadata/labels', value: {} });
    }
    for (const [key, value] of entries) {
      const escaped = key.replaceAll('~', '~0').replaceAll('/', '~1');
      ops.push({ op: 'add', path: `/metadata/labels/${escaped}`, value });
    }
    return { tag: 'patch', val: JSON.stringify(ops) };
  });
}
