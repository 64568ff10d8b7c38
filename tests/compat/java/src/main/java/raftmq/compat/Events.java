// One JSON object per line on stdout: the harness's only output that tests read.
package raftmq.compat;

import java.util.LinkedHashMap;
import java.util.Map;

final class Events {
    private Events() {
    }

    /** Starts an event: put fields in order, then {@link Event#emit()}. */
    static Event of(String kind) {
        return new Event(kind);
    }

    static final class Event {
        private final Map<String, Object> fields = new LinkedHashMap<>();

        private Event(String kind) {
            fields.put("event", kind);
            fields.put("atMs", System.currentTimeMillis());
        }

        Event put(String key, Object value) {
            fields.put(key, value);
            return this;
        }

        /** Prints the line; safe from any thread (lines never interleave). */
        void emit() {
            StringBuilder out = new StringBuilder(128).append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : fields.entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                quote(out, e.getKey());
                out.append(':');
                Object v = e.getValue();
                if (v == null) {
                    out.append("null");
                } else if (v instanceof Number || v instanceof Boolean) {
                    out.append(v);
                } else {
                    quote(out, v.toString());
                }
            }
            out.append('}');
            synchronized (System.out) {
                System.out.println(out);
                System.out.flush();
            }
        }
    }

    private static void quote(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }
}
