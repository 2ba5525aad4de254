"""Screenshots of the real window for issue 49 (4, 7, 8, 10), fresh folders each, under Xvfb at 1280x720:
    PYTHONPATH=app xvfb-run -a -s "-screen 0 1280x720x24" python docs/notes/issue49/shots_layout.py SCENE OUT.png
SCENE: empty (no model), code (a seeded answer with a long line; Copy pressed), enlarged (an answer,
then Enlarge), crash (serve, a crash mid-answer, Reload, two API requests), fit (the first-start window
after an answer in prompt lookup: the speculation pane and its stats whole, with no scroll bar)."""
import os, sys, tempfile, threading

def main():
    scene, out = sys.argv[1], sys.argv[2]
    root = tempfile.mkdtemp(prefix="shot-")
    os.environ.update(SPECULUM_DATA_DIR=f"{root}/data", SPECULUM_CONFIG_DIR=f"{root}/config")
    models = os.path.expanduser("~/.cache/speculum-dev/models")
    smollm = f"{models}/SmolLM2-135M-Instruct.Q4_1.gguf"
    if scene == "empty":
        os.environ["SPECULUM_MODELS_DIR"] = f"{root}/models"
    else:
        os.environ["SPECULUM_MODELS_DIR"] = models
    if scene == "crash":
        os.environ["SPECULUM_TEST_CRASH"] = "mid_generation"
    from PySide6.QtCore import QTimer, Qt
    from PySide6.QtWidgets import QApplication
    from speculum.ui import look
    app = QApplication(sys.argv[:1])
    look.use_light_look(app)
    from speculum.conversations import Conversation, ConversationStore, Message
    from speculum.ui.settings import Settings
    s = Settings()
    s.max_tokens = 48
    s.n_ctx = 1024
    if scene == "code":
        code = ("def summarise_orders(orders):\n"
                "    totals = {customer: sum(order.amount for order in orders if order.customer == customer and order.status in (\"paid\", \"shipped\")) for customer in {o.customer for o in orders}}\n"
                "    return sorted(totals.items(), key=lambda item: item[1], reverse=True)")
        conv = Conversation(title="Totals per customer")
        conv.messages = [Message("user", "Write a function that totals paid and shipped orders per customer."),
                         Message("assistant", f"Here is one way:\n\n```python\n{code}\n```\n\nIt keeps the customers with the largest totals first.", mode="lookup")]
        ConversationStore().save(conv)
        s.conversation = conv.id
    s.save()
    from speculum.ui.mainwindow import MainWindow
    w = MainWindow(settings=Settings.load(), autoload=False)
    w.show()
    steps = []

    def shot(path=out):
        app.processEvents()
        img = w.screen().grabWindow(0)
        img.save(path)
        print("saved", path, img.width(), img.height())

    def after(ms, fn):
        QTimer.singleShot(ms, fn)

    def load_then(fn, draft=None):
        w.modelsLoaded.connect(lambda: after(300, fn))
        w.set_pair(smollm, draft, load=True)

    if scene == "empty":
        after(1500, lambda: (shot(), app.quit()))
    elif scene == "code":
        def copy():
            buttons = w.chat.transcript.code_blocks.copy_buttons
            buttons[0].click()
            after(100, lambda: (shot(), app.quit()))
        after(1500, copy)
    elif scene == "enlarged":
        w.settings.mode = "lookup"
        def ask():
            w.model_bar.mode_combo.setCurrentIndex(w.model_bar.mode_combo.findData("lookup"))
            w.generationFinished.connect(lambda: after(500, big))
            w.chat.input.setPlainText("Copy this text exactly, twice: The quick brown fox jumps over the lazy dog. "
                                      "Pack my box with five dozen liquor jugs.")
            w.send(w.chat.input.toPlainText())
        def big():
            w.speculation_pane.enlarge_button.click()
            after(500, lambda: (shot(), app.quit()))
        load_then(ask)
    elif scene == "fit":
        def ask():
            w.model_bar.mode_combo.setCurrentIndex(w.model_bar.mode_combo.findData("lookup"))
            w.generationFinished.connect(lambda: after(800, lambda: (shot(), app.quit())))
            w.send("Copy this text exactly, twice: The quick brown fox jumps over the lazy dog. "
                   "Pack my box with five dozen liquor jugs.")
        load_then(ask)
    elif scene == "crash":
        port = 8091
        def serve():
            w.model_bar.serve_panel.port.setValue(port)
            w.engine.worker.serving.connect(on_serving)
            w.model_bar.serve_panel.switch.click()
        state = {"n": 0}
        def on_serving(url, model):
            state["n"] += 1
            if state["n"] == 1:
                w.engineDied.connect(lambda: after(500, reload))
                w.send("Count from one to twenty in words.")
            elif state["n"] == 2:
                threading.Thread(target=requests, args=(model,), daemon=True).start()
        def reload():
            os.environ.pop("SPECULUM_TEST_CRASH", None)
            w.chat.banner.trigger("Reload")
        def requests(model):
            import httpx
            for _ in range(2):
                httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
                    "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6})
        def wait_answered():
            if w.model_bar.serve_panel.answered >= 2:
                after(500, lambda: (shot(), app.quit()))
            else:
                after(300, wait_answered)
        load_then(serve)
        after(2000, wait_answered)
    after(240_000, app.quit)
    app.exec()
    w.close()

if __name__ == "__main__":
    main()
