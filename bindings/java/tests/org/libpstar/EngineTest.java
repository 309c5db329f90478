package org.libpstar;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import org.junit.jupiter.api.Test;
import org.libpstar.capi.PstarC;

/** The Java binding: errors, values, views, training while chunks move. */
class EngineTest {
  static Options small(long capacity) {
    return new Options().emulated().chunkElems(256).computeDtype(PstarC.PSTAR_DTYPE_F32).deviceCapacity(capacity)
        .lr(1e-2f).weightDecay(0f);
  }

  @Test
  void versionAndConstants() {
    assertEquals("0.1.0", Engine.version());
    assertEquals(-6, PstarC.PSTAR_ERR_BUSY);
    assertEquals("PSTAR_ERR_BUSY", PstarC.pstar_status_name(PstarC.PSTAR_ERR_BUSY));
    // A code the binding does not know: a plain PstarException.
    PstarException unknown = PstarException.of(-999, "somewhere");
    assertEquals(PstarException.class, unknown.getClass());
    assertEquals("PSTAR_ERR_UNKNOWN", unknown.statusName());
  }

  @Test
  void wrongCallsThrowTypedExceptionsWithTheLibraryMessage() {
    try (Engine e = new Engine(small(0))) {
      Engine.Param w = e.register("w", 4, 4);
      PstarException.InvalidArgument taken =
          assertThrows(PstarException.InvalidArgument.class, () -> e.register("w", 4));
      assertEquals(PstarC.PSTAR_ERR_INVALID_ARGUMENT, taken.status());
      assertEquals("pstar_param_register", taken.call());
      assertFalse(taken.libraryMessage().isEmpty());
      e.build();
      assertThrows(PstarException.InvalidState.class, () -> e.register("late", 4));
      PstarException.InvalidArgument shortWrite =
          assertThrows(PstarException.InvalidArgument.class, () -> e.write(w, new float[15]));
      assertTrue(shortWrite.libraryMessage().contains("15"), shortWrite.getMessage());
      assertThrows(PstarException.NotFound.class, () -> e.find("nope"));
    }
    Options bad = small(0);
    bad.raw().setBeta1(1.5f);
    assertThrows(PstarException.InvalidArgument.class, () -> new Engine(bad));
  }

  @Test
  void aClosedEngineAnswersInvalidHandleFromTheLibrary() {
    Engine e = new Engine(small(0));
    e.close();
    e.close(); // idempotent
    PstarException.InvalidHandle h = assertThrows(PstarException.InvalidHandle.class, e::build);
    assertEquals("pstar_engine_build", h.call());
  }

  @Test
  void aViewIsADirectReadOnlyBufferInNativeOrder() {
    try (Engine e = new Engine(small(0))) {
      Engine.Param w = e.register("w", 2, 3);
      e.build();
      float[] values = {0.5f, 1f, 1.5f, 2f, 2.5f, 3f};
      e.write(w, values);
      e.beginEval();
      try (View v = e.acquire(w, Engine.Stage.FORWARD)) {
        ByteBuffer b = v.buffer();
        assertTrue(b.isDirect());
        assertTrue(b.isReadOnly());
        float[] seen = new float[6];
        v.floats().get(seen);
        assertArrayEquals(values, seen);
      }
      try (View v = e.acquire(w, Engine.Stage.FORWARD, true)) {
        assertFalse(v.buffer().isReadOnly());
      }
      e.endIteration();
      float[] back = new float[6];
      e.read(w, back);
      assertArrayEquals(values, back);
    }
  }

  @Test
  void aPinnedMasterIsTheValuesInPlaceAndBlocksAStep() {
    try (Engine e = new Engine(small(0).computeDtype(PstarC.PSTAR_DTYPE_BF16))) {
      Engine.Param w = e.register("w", 8);
      e.build();
      float[] values = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f, 0.7f, -0.8f};
      e.write(w, values);
      try (PinnedMaster m = e.pin(w)) {
        float[] seen = new float[8];
        m.floats().get(seen);
        assertArrayEquals(values, seen); // fp32, not rounded to bf16
        assertTrue(m.floats().isReadOnly());
        e.beginTrain();
        e.acquire(w, Engine.Stage.FORWARD).close();
        try (View v = e.acquire(w, Engine.Stage.BACKWARD)) {
          float[] g = new float[8];
          java.util.Arrays.fill(g, 1f);
          e.gradWrite(w, g);
        }
        PstarException.Busy busy = assertThrows(PstarException.Busy.class, e::step);
        assertTrue(busy.libraryMessage().contains("pinned"));
      }
      e.step();
      try (PinnedMaster m = e.pin(w)) {
        assertTrue(m.floats().get(0) != values[0], "the step updated the master");
      }
    }
  }

  @Test
  void anAbortedIterationReleasesItsViewAndUpdatesNothing() {
    try (Engine e = new Engine(small(0))) {
      Engine.Param w = e.register("w", 8);
      e.build();
      float[] values = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f, 0.7f, -0.8f};
      e.write(w, values);
      assertThrows(PstarException.InvalidState.class, e::abortIteration);
      e.beginTrain();
      e.acquire(w, Engine.Stage.FORWARD).close();
      e.acquire(w, Engine.Stage.BACKWARD); // left open, as an exception could leave it
      float[] g = new float[8];
      java.util.Arrays.fill(g, 1f);
      e.gradWrite(w, g);
      e.abortIteration();
      assertThrows(PstarException.InvalidState.class, e::step);
      float[] back = new float[8];
      e.read(w, back);
      assertArrayEquals(values, back);
      assertEquals(0, e.stats().getSteps());
      e.beginTrain(); // usable as after a step
      e.acquire(w, Engine.Stage.FORWARD).close();
      try (View v = e.acquire(w, Engine.Stage.BACKWARD)) {
        e.gradWrite(w, g);
      }
      assertEquals(1, e.step().step);
    }
  }

  @Test
  void theLogHandlerReceivesTheLibraryRecords() {
    java.util.List<String> seen = java.util.Collections.synchronizedList(new java.util.ArrayList<>());
    Engine.setLogHandler((level, message) -> seen.add(level + " " + message), PstarC.PSTAR_LOG_INFO);
    try (Engine e = new Engine(small(0))) {
      e.register("w", 4);
      e.build();
    } finally {
      Engine.setLogHandler(null, PstarC.PSTAR_LOG_WARN);
    }
    assertTrue(seen.stream().anyMatch(s -> s.startsWith(PstarC.PSTAR_LOG_INFO + " ") && s.contains("engine built")),
               seen.toString());
  }

  /** Least squares through tanh layers; returns the losses. */
  static float[] train(long capacity, int steps) {
    final int n = 16, batch = 32, layers = 4;
    float[] losses = new float[steps];
    java.util.Random rnd = new java.util.Random(7);
    try (Engine e = new Engine(small(capacity))) {
      Engine.Param[] w = new Engine.Param[layers];
      for (int i = 0; i < layers; ++i) w[i] = e.register("w" + i, n, n);
      e.build();
      for (Engine.Param p : w) {
        float[] v = new float[n * n];
        for (int i = 0; i < v.length; ++i) v[i] = (float) (rnd.nextGaussian() * 0.3);
        e.write(p, v);
      }
      float[] x = new float[batch * n];
      for (int i = 0; i < x.length; ++i) x[i] = (float) rnd.nextGaussian();
      float[] mix = new float[n * n];
      for (int i = 0; i < mix.length; ++i) mix[i] = (float) (rnd.nextGaussian() * 0.3);
      float[] y = Mat.tanh(Mat.mul(x, mix, batch, n, n));
      for (int s = 0; s < steps; ++s) {
        e.beginTrain();
        float[][] acts = new float[layers + 1][];
        acts[0] = x;
        for (int i = 0; i < layers; ++i) {
          try (View v = e.acquire(w[i], Engine.Stage.FORWARD)) {
            acts[i + 1] = Mat.tanh(Mat.mul(acts[i], Mat.of(v.floats()), batch, n, n));
          }
        }
        float[] err = new float[y.length];
        float loss = 0;
        for (int i = 0; i < y.length; ++i) {
          err[i] = acts[layers][i] - y[i];
          loss += err[i] * err[i];
        }
        losses[s] = loss / y.length;
        float[] grad = new float[y.length];
        for (int i = 0; i < y.length; ++i) grad[i] = 2 * err[i] / y.length;
        for (int i = layers - 1; i >= 0; --i) {
          try (View v = e.acquire(w[i], Engine.Stage.BACKWARD)) {
            float[] dz = new float[grad.length];
            for (int j = 0; j < dz.length; ++j) dz[j] = grad[j] * (1 - acts[i + 1][j] * acts[i + 1][j]);
            e.gradWrite(w[i], Mat.mul(Mat.t(acts[i], batch, n), dz, n, batch, n));
            grad = Mat.mul(dz, Mat.t(Mat.of(v.floats()), n, n), batch, n, n);
          }
        }
        e.step();
      }
      assertTrue(capacity == 0 || e.stats().getEvictions() > 0, "chunks moved");
    }
    return losses;
  }

  @Test
  void trainingReducesTheLossWhileChunksMove() {
    float[] losses = train(2 * 1024 + 2 * 1024 + 512, 80);
    assertTrue(losses[79] < 0.5f * losses[0], "loss " + losses[0] + " -> " + losses[79]);
    assertArrayEquals(train(0, 10), train(2 * 1024 + 2 * 1024 + 512, 10), 0f);
  }

  static final class Mat {
    static float[] of(FloatBuffer b) {
      float[] a = new float[b.remaining()];
      b.get(a);
      return a;
    }

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

    static float[] tanh(float[] a) {
      float[] r = new float[a.length];
      for (int i = 0; i < a.length; ++i) r[i] = (float) Math.tanh(a[i]);
      return r;
    }
  }
}
