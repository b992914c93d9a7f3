/* How the run page and the compare page read a run's per-group eval metrics. With data.eval_group_by
   the engine logs eval/<metric>/<group> for each value of that column; both pages draw the groups
   of one metric as the lines of one chart, "<metric> by <column>", beside eval/<metric>'s own. */
window.TemperMetricGroups = (function () {
  "use strict";
  // The engine's group labels (1-40 letters, digits, . _ + -); a name not of this form is no group.
  var GROUPED = /^(eval\/[^\/]+)\/([\p{L}\p{N}_.+-]{1,40})$/u;
  // The column name is the user's text: it goes into a chart title (plotly reads tags there) only when plain.
  var PLAIN = /^[\p{L}\p{N}_ .+-]{1,64}$/u;

  return {
    // For metric `name` of a run grouped by column `groupBy` ("" when it is not): null when the name
    // is no group's, else { metric, label, chart } where chart is the title and key of its chart.
    groupOf: function (name, groupBy) {
      var match = groupBy ? GROUPED.exec(name) : null;
      if (!match) return null;
      return { metric: match[1], label: match[2], chart: match[1] + " by " + (PLAIN.test(groupBy) ? groupBy : "group") };
    },
  };
})();
