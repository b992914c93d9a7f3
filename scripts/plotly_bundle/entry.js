// The traces Temper draws: scatter (in core: the run and compare pages' lines), bar (the dataset pages'
// length histograms) and parcoords (the compare page's hyperparameters). A page that asks for another
// trace type gets nothing drawn for it: tests/browser/test_charts.py checks each chart page's traces.
'use strict';

var Plotly = require('plotly.js/lib/core');

Plotly.register([
    require('plotly.js/lib/bar'),
    require('plotly.js/lib/parcoords'),
]);

module.exports = Plotly;
