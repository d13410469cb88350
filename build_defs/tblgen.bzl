"""Runs mlir-tblgen (from the system LLVM repo) in a genrule per generated file."""

def gentbl(name, td_file, outs, td_srcs = [], tblgen = "@llvm//:bin/mlir-tblgen", visibility = None):
    """Generates files from `td_file`.

    Args:
      name: name of the filegroup holding all generated files.
      td_file: the top-level .td file.
      outs: list of (flags, output file) pairs, e.g. ("-gen-op-decls", "Ops.h.inc").
      td_srcs: other local .td files that td_file includes.
      tblgen: the tblgen binary label.
      visibility: visibility of the filegroup.
    """
    generated = []
    for flags, out in outs:
        native.genrule(
            name = "%s__%s" % (name, out.replace("/", "_").replace(".", "_")),
            srcs = [td_file] + [s for s in td_srcs if s != td_file] + ["@llvm//:td_files"],
            outs = [out],
            tools = [tblgen],
            cmd = ("$(location {tblgen}) {flags} -I external/llvm/include " +
                   "-I $$(dirname $(location {td})) $(location {td}) -o $@").format(
                tblgen = tblgen,
                flags = flags,
                td = td_file,
            ),
            message = "mlir-tblgen %s %s" % (flags, out),
        )
        generated.append(out)
    native.filegroup(name = name, srcs = generated, visibility = visibility)
