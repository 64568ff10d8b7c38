// The harness's command line: SCENARIO NAMESRV [key=value ...], with typed getters.
package raftmq.compat;

import java.util.HashMap;
import java.util.Map;

final class Options {
    final String scenario;
    final String namesrv;
    private final Map<String, String> values = new HashMap<>();

    Options(String[] args) {
        if (args.length < 2) {
            throw new IllegalArgumentException(
                "usage: Harness SCENARIO NAMESRV [topic=T] [group=G] [count=N] [timeoutS=S] [createTopic=true] [queues=4]");
        }
        scenario = args[0];
        namesrv = args[1];
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("option not key=value: " + args[i]);
            }
            values.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
    }

    String str(String key, String dflt) {
        return values.getOrDefault(key, dflt);
    }

    int integer(String key, int dflt) {
        String v = values.get(key);
        return v == null ? dflt : Integer.parseInt(v);
    }

    boolean flag(String key, boolean dflt) {
        String v = values.get(key);
        return v == null ? dflt : Boolean.parseBoolean(v);
    }
}
