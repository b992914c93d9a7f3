/* People's text (a run's name) in a plotly chart. Plotly reads a few HTML tags in a trace's name,
   its hover text and a title (<b>, <i>, <br>, <sup>, <a href>, <span style> ...): it splits the text
   at them and puts each piece between them in a text node after decoding its entities (&lt; &gt;
   &amp; and numeric ones). So a name whose '&', '<' and '>' are written as those entities is drawn
   as the very characters it holds, "<b>bold</b>" as that, never as markup. Every string of a
   person's (or of data's) that the run page and the compare page hand plotly goes through literal(). */
window.TemperPlotText = (function () {
  "use strict";
  var ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;" };

  return {
    literal: function (text) {
      return String(text).replace(/[&<>]/g, function (character) { return ENTITIES[character]; });
    },
  };
})();
