"""selects.config_setting_group, as bazel_skylib defines it (match_any / match_all)."""

def _any(name, settings, visibility):
    # An alias chain: the first setting that matches, otherwise the rest of the chain; the last
    # link is the last setting itself.
    for i in range(len(settings) - 1):
        rest = settings[-1] if i == len(settings) - 2 else "%s__any_%d" % (name, i + 1)
        native.alias(
            name = name if i == 0 else "%s__any_%d" % (name, i),
            actual = select({
                settings[i]: settings[i],
                "//conditions:default": rest,
            }),
            visibility = visibility,
        )
    if len(settings) == 1:
        native.alias(name = name, actual = settings[0], visibility = visibility)

def _all(name, settings, visibility):
    # An alias chain: each setting in turn must match, otherwise the first one that does not.
    for i in range(len(settings) - 1):
        rest = settings[-1] if i == len(settings) - 2 else "%s__all_%d" % (name, i + 1)
        native.alias(
            name = name if i == 0 else "%s__all_%d" % (name, i),
            actual = select({
                settings[i]: rest,
                "//conditions:default": settings[i],
            }),
            visibility = visibility,
        )
    if len(settings) == 1:
        native.alias(name = name, actual = settings[0], visibility = visibility)

def _config_setting_group(name, match_any = [], match_all = [], visibility = None):
    if bool(match_any) == bool(match_all):
        fail("config_setting_group %s: exactly one of match_any and match_all" % name)
    if match_any:
        _any(name, match_any, visibility)
    else:
        _all(name, match_all, visibility)

selects = struct(config_setting_group = _config_setting_group)
