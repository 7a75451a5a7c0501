"""Run the unittest suite of this directory and write one line per test
case to the file named by argv[1]: "ok<TAB>name<TAB>seconds" or
"not ok<TAB>name<TAB>seconds<TAB>why" (t/client_python.pl makes each a TAP
assertion).  Exits 0 when every case passed."""
import os
import signal
import sys
import time
import unittest


class Result(unittest.TextTestResult):
    def __init__(self, *a, out=None, **kw):
        super().__init__(*a, **kw)
        self.out = out
        self.started = 0.0

    def startTest(self, test):
        self.started = time.monotonic()
        super().startTest(test)

    def _line(self, test, ok, why=""):
        took = time.monotonic() - self.started
        name = test.id().split(".", 2)[-1] if "." in test.id() else test.id()
        why = why.replace("\t", " ").replace("\n", " | ")
        self.out.write("%s\t%s\t%.1f\t%s\n" % ("ok" if ok else "not ok", name, took, why))
        self.out.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._line(test, True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._line(test, False, self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._line(test, False, self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._line(test, False, "skipped: " + reason)


def main():
    # The cancel tests interrupt the main thread with SIGINT, as Ctrl-C
    # would.  A process started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then installs no handler:
    # the interrupt would be lost and a long poll would wait for ever.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    with open(sys.argv[1], "w") as out:
        suite = unittest.defaultTestLoader.discover(here, top_level_dir=os.path.dirname(here))
        runner = unittest.TextTestRunner(
            verbosity=2, resultclass=lambda *a, **kw: Result(*a, out=out, **kw))
        result = runner.run(suite)
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)


if __name__ == "__main__":
    main()
