// piper-run: runs a compiled Piper strategy (see docs/piper-run.md).
#include "runtime/launch/PiperRun.h"

int main(int argc, char **argv) {
  return piper::runtime::piperRunMain(argc, argv);
}
