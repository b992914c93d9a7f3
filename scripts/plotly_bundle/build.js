// Bundles entry.js into static/vendor/plotly-temper.min.js as plotly.js builds its own dist files
// (its esbuild-config.js: the same plugins, aliases and defines), inside the same wrapper and under
// the same license banner as plotly's dist/plotly.min.js. Run by scripts/build_plotly_bundle.sh.
// The one difference: plotly's CSS-inlining plugin (esbuild-plugin-inline-css) names each stylesheet it
// injects by a hash of the file's absolute path, so the bundle changed with the directory it was built in;
// inlineCss below names it by its path inside node_modules, and the same pins build the same file anywhere.
'use strict';

const fs = require('fs');
const path = require('path');
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const crypto = require('crypto');

const TRACES = 'scatter, bar, parcoords';
const output = process.argv[2];
if (!output) throw new Error('usage: node build.js <output file>');

const plotlyDist = fs.readFileSync(require.resolve('plotly.js/dist/plotly.min.js'), 'utf8');
const license = plotlyDist.slice(0, plotlyDist.indexOf('*/') + 2);
if (!/^\/\*\*\n\* plotly\.js v[\d.]+\n/.test(license)) throw new Error('plotly.js/dist/plotly.min.js opens with no license banner');
const banner = license.replace(/^(\/\*\*\n\* plotly\.js) v/, `$1 (Temper: ${TRACES} - minified) v`);

// A CSS file required by the bundle's code (maplibre's, which plotly injects only for map traces) becomes code
// that adds it to the page once, as esbuild-plugin-inline-css writes it.
const inlineCss = {
    name: 'inline-css',
    setup(build) {
        build.onLoad({ filter: /\.css$/ }, (args) => {
            const id = crypto.createHash('sha256').update(path.relative(__dirname, args.path)).digest('hex');
            const css = fs.readFileSync(args.path, 'utf8');
            return {
                loader: 'js',
                contents: `(function(){
        if (!document.getElementById('${id}')) {
            var e = document.createElement('style');
            e.id = '${id}';
            e.textContent = \`${css}\`;
            document.head.appendChild(e);
        }
    })();`,
            };
        });
    },
};

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
    plugins: [inlineCss, glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
    alias: { regl: '@plotly/regl', stream: 'stream-browserify' },
    define: { global: 'window', 'define.amd': 'false' },
    target: 'es2016',
    logLevel: 'warning',
}).then((result) => {
    const [file] = result.outputFiles;
    fs.writeFileSync(output, banner + '\n' + HEAD + file.text.trimEnd() + '\n' + TAIL);
    console.log(`${output}: ${fs.statSync(output).size} bytes`);
});
