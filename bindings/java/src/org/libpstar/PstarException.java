package org.libpstar;

import org.libpstar.capi.PstarC;

/**
 * A failed libpstar call: the status code, its C name ("PSTAR_ERR_BUSY"), the
 * library's message and the C function. Each known status has its own
 * subclass; a status this binding does not know (added by a later library)
 * is a plain PstarException.
 */
public class PstarException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final int status;
  private final String statusName;
  private final String libraryMessage;
  private final String call;

  public PstarException(int status, String statusName, String libraryMessage, String call) {
    super(call + ": " + statusName + ": " + libraryMessage);
    this.status = status;
    this.statusName = statusName;
    this.libraryMessage = libraryMessage;
    this.call = call;
  }

  public int status() { return status; }
  public String statusName() { return statusName; }
  public String libraryMessage() { return libraryMessage; }
  public String call() { return call; }

  /** The exception for a non-OK status, with the last error message. */
  public static PstarException of(int status, String call) {
    String name = PstarC.pstar_status_name(status);
    String message = PstarC.pstar_last_error_message();
    if (message == null || message.isEmpty()) message = PstarC.pstar_status_string(status);
    switch (status) {
      case PstarC.PSTAR_ERR_INVALID_ARGUMENT: return new InvalidArgument(status, name, message, call);
      case PstarC.PSTAR_ERR_INVALID_HANDLE: return new InvalidHandle(status, name, message, call);
      case PstarC.PSTAR_ERR_INVALID_STATE: return new InvalidState(status, name, message, call);
      case PstarC.PSTAR_ERR_NOT_FOUND: return new NotFound(status, name, message, call);
      case PstarC.PSTAR_ERR_OUT_OF_MEMORY: return new OutOfMemory(status, name, message, call);
      case PstarC.PSTAR_ERR_BUSY: return new Busy(status, name, message, call);
      case PstarC.PSTAR_ERR_UNSUPPORTED: return new Unsupported(status, name, message, call);
      case PstarC.PSTAR_ERR_DEVICE: return new Device(status, name, message, call);
      case PstarC.PSTAR_ERR_IO: return new Io(status, name, message, call);
      case PstarC.PSTAR_ERR_COMM: return new Comm(status, name, message, call);
      case PstarC.PSTAR_ERR_VERSION: return new Version(status, name, message, call);
      case PstarC.PSTAR_ERR_INTERNAL: return new Internal(status, name, message, call);
      default: return new PstarException(status, name, message, call);
    }
  }

  /** Throws for any status but PSTAR_OK. */
  static void check(int status, String call) {
    if (status != PstarC.PSTAR_OK) throw of(status, call);
  }

  public static class InvalidArgument extends PstarException {
    private static final long serialVersionUID = 1L;
    InvalidArgument(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class InvalidHandle extends PstarException {
    private static final long serialVersionUID = 1L;
    InvalidHandle(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class InvalidState extends PstarException {
    private static final long serialVersionUID = 1L;
    InvalidState(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class NotFound extends PstarException {
    private static final long serialVersionUID = 1L;
    NotFound(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class OutOfMemory extends PstarException {
    private static final long serialVersionUID = 1L;
    OutOfMemory(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class Busy extends PstarException {
    private static final long serialVersionUID = 1L;
    Busy(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class Unsupported extends PstarException {
    private static final long serialVersionUID = 1L;
    Unsupported(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class Device extends PstarException {
    private static final long serialVersionUID = 1L;
    Device(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class Io extends PstarException {
    private static final long serialVersionUID = 1L;
    Io(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class Comm extends PstarException {
    private static final long serialVersionUID = 1L;
    Comm(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class Version extends PstarException {
    private static final long serialVersionUID = 1L;
    Version(int s, String n, String m, String c) { super(s, n, m, c); }
  }
  public static class Internal extends PstarException {
    private static final long serialVersionUID = 1L;
    Internal(int s, String n, String m, String c) { super(s, n, m, c); }
  }
}
