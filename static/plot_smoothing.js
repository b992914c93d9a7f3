/* The smoothing of the run page's and compare page's curves: a debiased exponential moving average, as
   TensorBoard and W&B draw it, so that the first points are not pulled towards 0. */
window.TemperSmoothing = (function () {
  "use strict";
  return {
    // ``values`` smoothed with ``weight`` in [0, 1): 0 gives them back as they are.
    ema: function (values, weight) {
      if (!weight) return values;
      var out = [], last = 0, debias = 0;
      for (var i = 0; i < values.length; i++) {
        last = last * weight + (1 - weight) * values[i];
        debias = debias * weight + (1 - weight);
        out.push(last / debias);
      }
      return out;
    },
  };
})();
