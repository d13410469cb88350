// piper-opt: runs piper passes on .mlir files (lit tests, debugging).
#include "compiler/driver/Driver.h"

int main(int argc, char **argv) { return mlir::piper::piperOptMain(argc, argv); }
