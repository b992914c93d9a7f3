// Bundles entry.js into static/vendor/plotly-temper.min.js as plotly.js builds its own dist files
// (its esbuild-config.js: the same plugins, aliases and defines), inside the same wrapper and under
// the same license banner as plotly's dist/plotly.min.js. Run by scripts/build_plotly_bundle.sh.
'use strict';

const fs = require('fs');
const path = require('path');
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');

const TRACES = 'scatter, bar, parcoords';
const output = process.argv[2];
if (!output) throw new Error('usage: node build.js <output file>');

const plotlyDist = fs.readFileSync(require.resolve('plotly.js/dist/plotly.min.js'), 'utf8');
const license = plotlyDist.slice(0, plotlyDist.indexOf('*/') + 2);
if (!/^\/\*\*\n\* plotly\.js v[\d.]+\n/.test(license)) throw new Error('plotly.js/dist/plotly.min.js opens with no license banner');
const banner = license.replace(/^(\/\*\*\n\* plotly\.js) v/, `$1 (Temper: ${TRACES} - minified) v`);

// The wrapper of plotly's dist files: CommonJS where there is a module system, window.Plotly everywhere.
const HEAD = `(
 function(root, factory) {
  if (typeof module === "object" && module.exports) {
   module.exports = factory();
  } else {
   root.moduleName = factory();
  }
} (typeof self !== "undefined" ? self : this, () => {
`;
const TAIL = `
window.Plotly = Plotly;
return Plotly;
}));`;

esbuild.build({
    entryPoints: [path.join(__dirname, 'entry.js')],
    format: 'iife',
    globalName: 'Plotly',
    bundle: true,
    minify: true,
    write: false,
    outfile: 'plotly-temper.min.js',
    plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
    alias: { regl: '@plotly/regl', stream: 'stream-browserify' },
    define: { global: 'window', 'define.amd': 'false' },
    target: 'es2016',
    logLevel: 'warning',
}).then((result) => {
    const [file] = result.outputFiles;
    fs.writeFileSync(output, banner + '\n' + HEAD + file.text.trimEnd() + '\n' + TAIL);
    console.log(`${output}: ${fs.statSync(output).size} bytes`);
});
