package org.libpstar.examples;

import java.nio.FloatBuffer;
import org.libpstar.Engine;
import org.libpstar.Options;
import org.libpstar.View;
import org.libpstar.capi.PstarC;

/**
 * A two-layer MLP (tanh hidden layer) trained in plain Java with its weights
 * in libpstar chunks on an emulated device that holds only part of them, so
 * chunks move every iteration. Exits 1 if the loss does not fall by half.
 */
public final class Mlp {
  static final int IN = 32, HIDDEN = 64, OUT = 8, BATCH = 64, STEPS = 300;

  static float[] mul(float[] a, float[] b, int n, int k, int m) {
    float[] c = new float[n * m];
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < k; ++p) {
        float aip = a[i * k + p];
        for (int j = 0; j < m; ++j) c[i * m + j] += aip * b[p * m + j];
      }
    return c;
  }

  static float[] t(float[] a, int n, int m) {
    float[] r = new float[n * m];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < m; ++j) r[j * n + i] = a[i * m + j];
    return r;
  }

  static float[] values(View v) {
    FloatBuffer b = v.floats();
    float[] a = new float[b.remaining()];
    b.get(a);
    return a;
  }

  public static void main(String[] args) {
    long capacity = 2L * 1024 * 4 + (long) (IN * HIDDEN + HIDDEN * OUT) * 4;
    Options options = new Options().emulated().deviceCapacity(capacity).chunkElems(1024)
        .computeDtype(PstarC.PSTAR_DTYPE_F32).lr(3e-3f).weightDecay(0f);
    java.util.Random rnd = new java.util.Random(2024);
    float first = 0, last = 0;
    try (Engine e = new Engine(options)) {
      Engine.Param w1 = e.register("w1", IN, HIDDEN);
      Engine.Param w2 = e.register("w2", HIDDEN, OUT);
      e.build();
      float[] init1 = new float[IN * HIDDEN], init2 = new float[HIDDEN * OUT];
      for (int i = 0; i < init1.length; ++i) init1[i] = (float) ((rnd.nextDouble() - 0.5) * 0.4);
      for (int i = 0; i < init2.length; ++i) init2[i] = (float) ((rnd.nextDouble() - 0.5) * 0.4);
      e.write(w1, init1);
      e.write(w2, init2);
      float[] x = new float[BATCH * IN];
      for (int i = 0; i < x.length; ++i) x[i] = (float) ((rnd.nextDouble() - 0.5) * 2);
      float[] y = new float[BATCH * OUT];
      for (int b = 0; b < BATCH; ++b)
        for (int o = 0; o < OUT; ++o) y[b * OUT + o] = (float) (Math.sin(x[b * IN + o] * x[b * IN + o + OUT]) * 0.5);
      for (int step = 0; step < STEPS; ++step) {
        e.beginTrain();
        float[] h;
        try (View v = e.acquire(w1, Engine.Stage.FORWARD)) {
          h = mul(x, values(v), BATCH, IN, HIDDEN);
        }
        for (int i = 0; i < h.length; ++i) h[i] = (float) Math.tanh(h[i]);
        float[] out;
        try (View v = e.acquire(w2, Engine.Stage.FORWARD)) {
          out = mul(h, values(v), BATCH, HIDDEN, OUT);
        }
        float loss = 0;
        float[] dout = new float[out.length];
        for (int i = 0; i < out.length; ++i) {
          float d = out[i] - y[i];
          loss += d * d;
          dout[i] = 2 * d / out.length;
        }
        loss /= out.length;
        float[] dh;
        try (View v = e.acquire(w2, Engine.Stage.BACKWARD)) {
          e.gradWrite(w2, mul(t(h, BATCH, HIDDEN), dout, HIDDEN, BATCH, OUT));
          dh = mul(dout, t(values(v), HIDDEN, OUT), BATCH, OUT, HIDDEN);
        }
        for (int i = 0; i < dh.length; ++i) dh[i] *= 1 - h[i] * h[i];
        try (View v = e.acquire(w1, Engine.Stage.BACKWARD)) {
          e.gradWrite(w1, mul(t(x, BATCH, IN), dh, IN, BATCH, HIDDEN));
        }
        e.step();
        if (step == 0) first = loss;
        last = loss;
        if (step % 50 == 0 || step == STEPS - 1) {
          System.out.printf("step %4d  loss %.6f  evictions %d%n", step + 1, loss, e.stats().getEvictions());
        }
      }
    }
    System.out.printf("final loss: %.6f (first: %.6f)%n", last, first);
    if (!(last < 0.5f * first)) System.exit(1);
  }
}
